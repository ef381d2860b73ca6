"""An older head put back on PostgreSQL, then grown past every replica's mark by another replica.

Was wrong: the high-water mark (and a running writer's "a head only moves forward") compared record
numbers only. Someone who can write the database but holds no key cuts the end of the chain and puts an
older authentic head back; a replica that had not seen the cut records (a new pod without a mark, or one
whose last commit was before them) continues from that head and numbers new records past where the cut
ones ended. The replica that wrote the cut records then finds a head "ahead" of its own and continues, its
next start sees a head above its mark, and `audit verify` passes: the cut records, decisions callers were
told were recorded, are gone without trace. The mark now also names the hash of the record it stands for,
and the writer checks that the record it last saw is still there unchanged when another process moved the
head: a chain that was cut and grown again is a fork, refused and reported.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import asyncpg
import pytest

from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.pgsync import PgLocation
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database, off


def rec(i: int) -> AuditRecord:
    return AuditRecord(f"req-{i}", "decision", "agent", "list_nodes", "default/qemu/100", "allow", {"i": i})


async def test_a_chain_cut_and_grown_again_by_another_replica_is_found(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # two replicas, each with its own copy of the key (and so its own high-water mark), as on two hosts
    key_a = tmp_path / "a" / "audit-head.key"
    key_a.parent.mkdir()
    url = await new_pg_database(postgres, key=key_a)
    key_b = tmp_path / "b" / "audit-head.key"
    key_b.parent.mkdir()
    shutil.copy2(key_a, key_b)
    a, b = AuditLog(PgLocation(url), head_key=key_a), AuditLog(PgLocation(url), head_key=key_b)
    await a.open()
    await b.open()
    con = await asyncpg.connect(url)
    try:
        await b.append(*[rec(i) for i in range(10)])  # B's last sight of the chain: record 10
        old_head = await con.fetchval("SELECT value FROM audit_meta WHERE key = 'head'")
        await a.append(*[rec(i) for i in range(10, 20)])  # records 11..20, A's
        await a.close()  # A's mark: record 20
        # without the key: cut A's records, put the older (authentic) head back
        await con.execute("DELETE FROM audit WHERE seq > 10")
        await con.execute("UPDATE audit_meta SET value = $1 WHERE key = 'head'", old_head)
        # B continues from the head it knows, past where A's records ended
        await b.append(*[rec(i) for i in range(100, 115)])
        await b.close()
    finally:
        await con.close()
    assert await _max_seq(url) == 25
    # A's host: its mark (record 20) is below the head now, yet record 20 is not the one A wrote
    res = off(auditlib.verify, PgLocation(url), key=key_a)
    assert not res.ok, "verify passed over records 11..20 cut and replaced"
    assert res.problem is not None and "high-water mark" in res.problem
    again = AuditLog(PgLocation(url), head_key=key_a)
    with pytest.raises(auditlib.AuditIntegrityError, match="high-water mark"):
        await again.open()
    await again.close()


async def test_a_running_replica_never_continues_a_chain_cut_and_grown_past_it(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The replica that wrote the cut records is still running: once the other has numbered past it, the
    head looks ahead of it; continuing (and marking that head) would hide the cut for good."""
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    a, b = AuditLog(PgLocation(url), head_key=key), AuditLog(PgLocation(url), head_key=key)
    await a.open()
    await b.open()
    con = await asyncpg.connect(url)
    try:
        await b.append(*[rec(i) for i in range(10)])
        old_head = await con.fetchval("SELECT value FROM audit_meta WHERE key = 'head'")
        await a.append(*[rec(i) for i in range(10, 20)])  # A saw record 20
        await con.execute("DELETE FROM audit WHERE seq > 10")
        await con.execute("UPDATE audit_meta SET value = $1 WHERE key = 'head'", old_head)
        await b.append(*[rec(i) for i in range(100, 115)])  # B: records 11..25, another chain
        with pytest.raises(auditlib.AuditIntegrityError, match="record 20 is no longer the record"):
            await a.append(rec(200))
    finally:
        await con.close()
        await a.close()
        await b.close()
    assert await _max_seq(url) == 25  # nothing written over the fork


async def _max_seq(url: str) -> int:
    con = await asyncpg.connect(url)
    try:
        return int(await con.fetchval("SELECT max(seq) FROM audit"))
    finally:
        await con.close()
