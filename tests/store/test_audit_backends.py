"""The audit log on both backends: one hash chain, the keyed head, tamper detection, archive and
checkpoint, the operator commands, reconciliation's reads, and versioned schemas.

Each test in the first part runs on a SQLite file and on a real PostgreSQL (tests/pgserver.py);
the PostgreSQL-only tests below it cover what only replicas have: several writer processes on one
chain, a key every replica must share, whose call is whose, and the server going away under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.cli import main as cli
from gateway.dev.procs import die_with_parent
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord, AuditStoreError
from gateway.store.audit_seal import AuditKeyError, HeadKey
from gateway.store.db import PostgresDatabase
from gateway.store.migrations import SchemaError
from gateway.store.outcomes import AuditUnavailable, ClaimLost, Outcomes
from gateway.store.pgsync import PgLocation
from gateway.store.reconcile import Reconciler, claimed_tasks, open_calls
from tests.config.conftest import minimal, write
from tests.pgserver import PostgresServer, start_postgres
from tests.store.auditstore import Store, new_pg_database, off, sign_new_chain


def rec(i: int, kind: str = "decision", outcome: str | None = "allow", **body: Any) -> AuditRecord:
    return AuditRecord(f"req-{i}", kind, "agent", "list_nodes", "default/qemu/100", outcome, {"i": i, **body})


async def filled(store: Store, n: int = 30, outcome: str = "allow") -> None:
    """n calls of two records each; allowed ones stay open (no result), which archive never cuts past."""
    log = store.log()
    await log.open()
    try:
        await asyncio.gather(*[log.append(rec(i, "received", None), rec(i, outcome=outcome)) for i in range(n)])
    finally:
        await log.close()


# --- on both backends ----------------------------------------------------------------------------


async def test_concurrent_appends_make_one_verified_chain_with_group_commits(store: Store) -> None:
    log = store.log()
    await log.open()
    try:
        await asyncio.gather(*[log.append(rec(i)) for i in range(300)])
        assert log.records == 300
        assert log.commits < 300  # waiters queued behind a commit share the next one
        rows = await log.rows()
        assert [r["seq"] for r in rows] == list(range(1, 301))
        assert len(await log.rows("req-7")) == 1
        assert len(await log.allowed_since(time.time() - 60)) == 300
    finally:
        await log.close()
    res = await asyncio.to_thread(auditlib.verify, store.where, key=store.key)
    assert res.ok and res.checked == 300 and res.last_seq == 300, res.problem


async def test_append_returns_only_when_committed_and_a_reopened_log_continues_the_chain(store: Store) -> None:
    log = store.log()
    await log.open()
    await log.append(rec(1))
    # another connection sees it at once
    assert [r["outcome"] for r in off(auditlib.search, store.where, auditlib.Query())] == ["allow"]
    await log.close()
    again = store.log()
    await again.open()
    try:
        await again.append(rec(2), rec(3, "result", "ok"))
    finally:
        await again.close()
    res = off(auditlib.verify, store.where, key=store.key)
    assert res.ok and res.checked == 3, res.problem


async def test_lone_surrogates_and_nul_are_stored_escaped_and_chained(store: Store) -> None:
    log = store.log()
    await log.open()
    try:
        await log.append(AuditRecord("r-\ud800", "received", "a\x00b", "t", None, None, {"x": "\ud800\x00"}))
    finally:
        await log.close()
    rows = off(auditlib.search, store.where, auditlib.Query())
    assert rows[0]["principal"] == "a\\x00b" and rows[0]["request_id"] == "r-\\ud800"
    assert off(auditlib.verify, store.where, key=store.key).ok


@pytest.mark.parametrize(
    ("tamper", "bad_seq", "words"),
    [
        ("UPDATE audit SET outcome = 'deny' WHERE seq = 17", 17, "was changed"),
        ("UPDATE audit SET body = '{\"i\":99}' WHERE seq = 5", 5, "was changed"),
        ("DELETE FROM audit WHERE seq = 23", 23, "missing (deleted)"),
        ("DELETE FROM audit WHERE seq >= 58", 58, "missing (deleted)"),
        ("UPDATE audit_meta SET value = replace(value, '\"seq\":60', '\"seq\":61') WHERE key = 'head'", None, "head"),
    ],
)
async def test_tampering_is_found_at_the_right_record(
    store: Store, tamper: str, bad_seq: int | None, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await filled(store)
    assert off(auditlib.verify, store.where, key=store.key).ok
    store.sql(tamper)
    res = await asyncio.to_thread(auditlib.verify, store.where, key=store.key)
    assert not res.ok
    assert res.bad_seq == bad_seq, res.problem
    assert words in (res.problem or "")
    assert await asyncio.to_thread(cli, ["audit", "verify", "--config", str(store.config())]) == 1
    assert "FAILED" in capsys.readouterr().err


async def test_reordered_records_are_found(store: Store) -> None:
    """Records 10 and 11 swapped, their seq kept in order: each still hashes right alone, the chain
    does not link (the SQLite-only original: tests/audit/test_chain.py)."""
    await filled(store, 10)
    store.sql(
        "UPDATE audit SET seq = -1 WHERE seq = 10",
        "UPDATE audit SET seq = 10 WHERE seq = 11",
        "UPDATE audit SET seq = 11 WHERE seq = -1",
    )
    res = off(auditlib.verify, store.where, key=store.key)
    assert not res.ok and res.bad_seq == 10 and "does not link" in (res.problem or ""), res.problem


async def test_a_running_writer_never_continues_from_an_older_head_put_back(store: Store) -> None:
    """An old head is authentic (the key signed it): put back over a cut end while the gateway
    runs, continuing from it would authenticate a chain with the cut records simply gone."""
    log = store.log()
    await log.open()
    try:
        await log.append(*[rec(i) for i in range(10)])
        old_head = store.value("SELECT value FROM audit_meta WHERE key = 'head'")
        await log.append(*[rec(i) for i in range(10, 20)])
        store.sql(
            "DELETE FROM audit WHERE seq > 10",
            "UPDATE audit_meta SET value = '" + str(old_head).replace("'", "''") + "' WHERE key = 'head'",
        )
        with pytest.raises(auditlib.AuditIntegrityError, match="went back from record 20 to record 10"):
            await log.append(rec(99))
    finally:
        await log.close()
    assert store.value("SELECT max(seq) FROM audit") == 10


async def test_a_checkpoint_catches_an_older_state_put_back(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The end of the chain cut and the head of that time put back: the older state is authentic
    on its own (verify passes), only a checkpoint taken later shows what is gone (the SQLite
    original copies the file back: tests/audit/test_seal.py)."""
    await filled(store, 5)
    old_head = store.value("SELECT value FROM audit_meta WHERE key = 'head'")
    await filled(store, 5)
    mark = tmp_path / "checkpoint.json"
    cfg = str(store.config())
    assert await asyncio.to_thread(cli, ["audit", "checkpoint", "--config", cfg, "--out", str(mark)]) == 0
    store.sql(
        "DELETE FROM audit WHERE seq > 10",
        "UPDATE audit_meta SET value = '" + str(old_head).replace("'", "''") + "' WHERE key = 'head'",
    )
    res = off(auditlib.verify, store.where, key=store.key)  # below the high-water mark kept next to the key
    assert not res.ok and res.bad_seq == 11 and "seq 20 was reached" in (res.problem or ""), res.problem
    store.key.with_name(store.key.name + ".hwm").unlink()  # whoever holds the key's directory too: checkpoints
    assert off(auditlib.verify, store.where, key=store.key).ok
    res = off(auditlib.verify, store.where, key=store.key, checkpoint=mark)
    assert not res.ok and res.bad_seq == 11 and "older copy" in (res.problem or ""), res.problem
    assert await asyncio.to_thread(cli, ["audit", "verify", "--config", cfg, "--checkpoint", str(mark)]) == 1
    assert "FAILED" in capsys.readouterr().err


async def test_the_writer_never_extends_a_cut_chain(store: Store) -> None:
    await filled(store, 5)
    running = store.log()
    await running.open()
    try:
        store.sql("DELETE FROM audit WHERE seq >= 9")
        # the head is intact, so this append continues from it: the gap stays for verify to find
        await running.append(rec(99))
    finally:
        await running.close()
    res = off(auditlib.verify, store.where, key=store.key)
    assert not res.ok and res.bad_seq == 9, res.problem
    store.sql("DELETE FROM audit WHERE seq >= 10")  # now the head (record 11) names a record that is gone
    log = store.log()
    with pytest.raises(auditlib.AuditIntegrityError, match="missing"):
        await log.open()
    await log.close()


async def test_the_head_key_must_match(store: Store, tmp_path: Path) -> None:
    await filled(store, 2)
    other = tmp_path / "other.key"
    HeadKey.create(other)
    with pytest.raises(auditlib.AuditIntegrityError, match="another audit head key"):
        log = AuditLog(store.where, head_key=other)
        try:
            await log.open()
        finally:
            await log.close()
    res = off(auditlib.verify, store.where, key=other)
    assert not res.ok and "another audit head key" in (res.problem or "")


async def test_checkpoint_archive_and_verify_across_the_cut(store: Store, tmp_path: Path) -> None:
    await filled(store, 20, "deny")
    mark = tmp_path / "checkpoint.json"
    mark.write_text(json.dumps(off(auditlib.checkpoint, store.where, key=store.key)))
    res = off(auditlib.archive, store.where, time.time() + 1, tmp_path / "arch", key=store.key)
    assert res.count == 40 and res.file is not None
    log = store.log()
    await log.open()  # the writer continues from the archived head
    try:
        await log.append(rec(100))
    finally:
        await log.close()
    ok = off(auditlib.verify, store.where, [res.file], key=store.key, checkpoint=mark)
    assert ok.ok and ok.checked == 41 and ok.checkpoint == 40, ok.problem
    assert [a["last"]["seq"] for a in off(auditlib.archives, store.where)] == [40]
    store.sql("DELETE FROM audit")
    gone = off(auditlib.verify, store.where, [res.file], key=store.key)
    assert not gone.ok and "missing" in (gone.problem or ""), gone.problem


async def test_cli_reads_the_store_the_configuration_names(
    store: Store, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    await filled(store, 10, "deny")  # no call left open: the archive below takes all 20 records
    cfg = str(store.config())

    def run(*args: str) -> tuple[int, str, str]:
        code = cli(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    def in_thread(*args: str) -> Any:
        return asyncio.to_thread(run, *args)

    code, out, _ = await in_thread("audit", "verify", "--config", cfg)
    assert code == 0 and "OK: 20 records verified" in out
    code, out, _ = await in_thread("audit", "tail", "--config", cfg, "-n", "3")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["18", "19", "20"]
    code, out, err = await in_thread(
        "audit", "search", "--config", cfg, "--target", "default/qemu/*", "--kind", "decision"
    )
    assert code == 0 and len(out.splitlines()) == 10 and "(10 records)" in err
    code, out, _ = await in_thread("audit", "search", "--config", cfg, "--target", "default/lxc/*")
    assert code == 0 and out == ""
    code, out, _ = await in_thread("audit", "export", "--config", cfg, "--jsonl", "--request-id", "req-3")
    assert code == 0 and [json.loads(line)["kind"] for line in out.splitlines()] == ["received", "decision"]
    code, out, _ = await in_thread("audit", "checkpoint", "--config", cfg)
    assert code == 0 and json.loads(out)["seq"] == 20
    code, out, _ = await in_thread(
        "audit", "archive", "--config", cfg, "--older-than", "0s", "--out-dir", str(tmp_path / "arch")
    )
    assert code == 0 and "archived records 1..20" in out
    code, out, _ = await in_thread("audit", "verify", "--config", cfg)
    assert code == 0 and "continuing from archived record 20" in out


async def test_reconciliation_reads_open_calls(store: Store) -> None:
    log = store.log()
    await log.open()
    try:
        await log.append(rec(1, "received", None, effect="read"), rec(1))
        await log.append(rec(2, "received", None, effect="mutate"), rec(2), rec(2, "dispatch", None, task_id="UPID:a"))
        await log.append(rec(3), rec(3, "result", "ok"))
        await log.append(rec(4), rec(4, "result", "interrupted", pending_reconcile=False))
        await log.append(rec(5), rec(5, "result", "interrupted", pending_reconcile=True))
    finally:
        await log.close()
    calls = off(open_calls, store.where, 0, time.time() + 1)
    assert [c.request_id for c in calls] == ["req-1", "req-2", "req-5"]
    assert calls[0].effect == "read" and calls[1].task_id == "UPID:a" and calls[1].dispatched
    # on PostgreSQL a decision names the replica that runs it; on SQLite (one host) nobody
    assert (calls[0].owner is not None) == (store.backend == "postgresql")


async def test_console_sign_ins_are_read_by_subject_and_window(store: Store) -> None:
    """What `pvegate console sign-out` asks before it signs anyone out: who signed in, since when."""

    def console(i: int, sub: str, action: str, outcome: str = "ok") -> AuditRecord:
        return AuditRecord(f"c-{i}", "console", sub, None, None, outcome, {"action": action, "surface": "console"})

    log = store.log()
    await log.open()
    try:
        await log.append(console(1, "carol", "sign_in"), console(2, "dave", "sign_in", "refused"))
        await log.append(console(3, "erin", "audit_search"), rec(4))
        since = time.time() - 60
        assert await log.console_sign_ins(since) == {"carol"}  # dave's was refused; erin never signed in
        assert await log.console_sign_ins(since, "carol") == {"carol"}
        assert await log.console_sign_ins(since, "erin") == set()
        assert await log.console_sign_ins(time.time() + 60, "carol") == set()  # outside the window
    finally:
        await log.close()


async def test_an_unreadable_body_does_not_stall_the_other_open_calls(store: Store) -> None:
    """A record edited outside the gateway so its body is no JSON: the pass still reads every open call
    (verify is where the edit is reported), instead of raising for all of them."""
    log = store.log()
    await log.open()
    try:
        await log.append(rec(1, "received", None, effect="mutate"), rec(1))
        await log.append(rec(2, "received", None, effect="mutate"), rec(2), rec(2, "dispatch", None, task_id="UPID:b"))
        await log.append(rec(3, "received", None, effect="mutate"), rec(3), rec(3, "dispatch", None, task_id="UPID:c"))
    finally:
        await log.close()
    store.sql(
        "UPDATE audit SET body = '{not json' WHERE request_id = 'req-1' AND kind = 'received'",
        "UPDATE audit SET body = '{not json' WHERE request_id = 'req-3' AND kind = 'dispatch'",
    )
    calls = off(open_calls, store.where, 0, time.time() + 1)
    assert [c.request_id for c in calls] == ["req-1", "req-2", "req-3"]
    assert calls[0].unreadable is not None and calls[1].unreadable is None  # req-1 is never matched on half its facts
    assert off(claimed_tasks, store.where, 0) == {"UPID:b"}  # the SQL parses no body: one bad one fails nothing


async def test_an_audit_schema_newer_than_this_pvegate_is_refused(store: Store) -> None:
    await filled(store, 1)
    store.sql("UPDATE pvegate_schema SET version = 99 WHERE component = 'audit'")
    log = store.log()
    with pytest.raises(SchemaError, match="audit schema in the database is version 99"):
        await log.open()
    await log.close()


# --- an upgrade from the current release's database (SQLite: main's audit file has no version row) ------


async def test_an_audit_file_of_the_previous_release_is_versioned_and_continued(tmp_path: Path) -> None:
    store = Store("sqlite", tmp_path / "audit.db", tmp_path / "audit-head.key", tmp_path)
    await filled(store, 3)
    # the previous release wrote exactly SCHEMA and no pvegate_schema row for the audit
    store.sql("DELETE FROM pvegate_schema WHERE component = 'audit'")
    log = store.log()
    await log.open()
    try:
        await log.append(rec(9))
    finally:
        await log.close()
    con = sqlite3.connect(store.where)
    assert con.execute("SELECT version FROM pvegate_schema WHERE component = 'audit'").fetchone() == (1,)
    con.close()
    assert off(auditlib.verify, store.where, key=store.key).ok


# --- PostgreSQL only -------------------------------------------------------------------------------


def _append_process(url: str, key: str, worker: int, n: int) -> None:
    async def run() -> None:
        log = AuditLog(PgLocation(url), head_key=Path(key))
        await log.open()
        try:
            for i in range(0, n, 5):  # a few in flight at once, so group commits race other processes too
                await asyncio.gather(*[log.append(rec(worker * 1000 + j)) for j in range(i, min(i + 5, n))])
        finally:
            await log.close()

    asyncio.run(run())


async def test_three_processes_appending_at_once_make_one_chain(postgres: PostgresServer, tmp_path: Path) -> None:
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_process, args=(url, str(key), w, 50)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    res = off(auditlib.verify, PgLocation(url), key=key)
    assert res.ok and res.checked == 150 and res.last_seq == 150, res.problem
    rows = off(auditlib.search, PgLocation(url), auditlib.Query())
    owners = {json.loads(r["body"])["replica"] for r in rows}
    assert len(owners) == 3  # each decision names the process that wrote it


async def test_a_replica_never_makes_the_key_and_a_fresh_chain_is_sealed_once(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = await new_pg_database(postgres)
    key = tmp_path / "audit-head.key"
    log = AuditLog(PgLocation(url), head_key=key)
    with pytest.raises(AuditKeyError, match="every replica needs the same key"):
        await log.open()
    assert not key.exists()
    HeadKey.create(key)
    unsigned = AuditLog(PgLocation(url), head_key=key)  # the migration's mark, not yet signed by db upgrade
    with pytest.raises(auditlib.AuditIntegrityError, match="mark is not signed: run `pvegate db upgrade`"):
        await unsigned.open()
    await unsigned.close()
    await sign_new_chain(url, key)
    logs = [AuditLog(PgLocation(url), head_key=key) for _ in range(3)]
    await asyncio.gather(*[x.open() for x in logs])  # replicas starting at once: one seals, all agree
    try:
        await asyncio.gather(*[x.append(rec(i)) for i, x in enumerate(logs)])
    finally:
        await asyncio.gather(*[x.close() for x in logs])
    assert off(auditlib.verify, PgLocation(url), key=key).ok
    # an emptied chain (rows and audit_meta gone) is not sealed again under the key
    con = await asyncpg.connect(url)
    await con.execute("DELETE FROM audit; DELETE FROM audit_meta")
    await con.close()
    again = AuditLog(PgLocation(url), head_key=key)
    with pytest.raises(auditlib.AuditIntegrityError, match="no records and no creation marker"):
        await again.open()
    await again.close()
    # nor when whoever emptied it marks it new by hand, as the migration does: that mark is not signed
    for mark in ("true", json.dumps({"key_id": "x", "nonce": "n", "ts": 1, "mac": "0" * 64})):
        con = await asyncpg.connect(url)
        await con.execute("DELETE FROM audit_meta")
        await con.execute("INSERT INTO audit_meta VALUES ('fresh', $1)", mark)
        await con.close()
        again = AuditLog(PgLocation(url), head_key=key)
        with pytest.raises(auditlib.AuditIntegrityError, match="is marked new"):
            await again.open()
        await again.close()
    assert off(auditlib.verify, PgLocation(url), key=key).ok is False  # still shown as emptied


async def two_replicas(postgres: PostgresServer, tmp_path: Path) -> tuple[str, Path, tuple[AuditLog, AuditLog]]:
    """A fresh audit database and two open replicas' logs on it (the caller closes them)."""
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    a, b = AuditLog(PgLocation(url), head_key=key), AuditLog(PgLocation(url), head_key=key)
    await a.open()
    await b.open()
    return url, key, (a, b)


async def age(con: asyncpg.Connection, replica: str | None, seconds: float) -> None:
    """Set a replica's heartbeat back by `seconds`, on the database's clock (a pause, with no local clock)."""
    await con.execute("UPDATE audit_replicas SET seen_at = seen_at - $1 WHERE replica = $2", seconds, replica)


async def test_a_live_replicas_calls_are_left_alone_a_gone_ones_are_settled(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url, key, (a, b) = await two_replicas(postgres, tmp_path)
    try:
        # replica A is running a read when B looks
        await a.append(rec(1, "received", None, effect="read"), rec(1))
        reconciler = Reconciler(None, None, Outcomes(b, grace_seconds=1, min_free_bytes=0), {})  # type: ignore[arg-type]
        settled = await reconciler.run_once(time.time() + 1)
        assert [(s.request_id, s.action, s.owner) for s in settled] == [("req-1", "in_flight", a.replica_id)]
        assert await reconciler.settle_stale_replicas() == []
        await a.close()  # a clean stop marks A gone at once (a killed A goes stale in REPLICA_STALE_SECONDS)
        assert a.replica_id in await b.stale_replicas()
        settled = await reconciler.settle_stale_replicas()
        assert [(s.request_id, s.action) for s in settled] == [("req-1", "interrupted")]
        assert a.replica_id not in await b.stale_replicas()  # forgotten once nothing of it is open
        assert off(open_calls, PgLocation(url), 0, time.time() + 1) == []
    finally:
        await b.close()
    assert off(auditlib.verify, PgLocation(url), key=key).ok


async def test_a_replica_paused_past_its_heartbeat_sends_nothing_it_decided_and_the_others_settle_it(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A decision is on disk, then the process stalls (a paused VM, SIGSTOP) past REPLICA_STALE_SECONDS:
    the others take its calls for a gone replica's and settle them. When it wakes it must not send
    what it decided under that name (else the audit says `not_found` for a call that then ran), and
    its later calls go on under a new name. Only the database's clock is trusted (a paused VM's own
    clocks stand still), so the pause here is the row's age set back; tests/replicas has the process
    really stopped."""
    url, key, (a, b) = await two_replicas(postgres, tmp_path)
    con = await asyncpg.connect(url)
    try:
        name = a.replica_id
        await a.append(rec(1, "received", None, effect="read"), rec(1))
        await a.hold(name)  # renewed now, by the database's clock: still this replica's
        assert a.replica_id == name

        # paused: the row is older than the lease, not yet stale for the others
        await age(con, name, auditlib.LEASE_SECONDS + 1)
        assert name in (await b.live_replicas() or set())
        with pytest.raises(auditlib.LeaseLost, match="not sent"):
            await a.hold(name)
        assert a.replica_id != name and a.leases_lost == 1
        with pytest.raises(auditlib.LeaseLost):  # no second chance for a call decided under the old name
            await a.hold(name)
        await a.hold(a.replica_id)  # its new calls are its own
        assert a.replica_id in (await b.live_replicas() or set())
        await age(con, name, auditlib.REPLICA_STALE_SECONDS)  # the old row goes stale in its time
        assert name in await b.stale_replicas()

        # the others settle the old name's call; its own reconciler leaves a call it still runs alone
        others = Reconciler(None, None, Outcomes(b, grace_seconds=1, min_free_bytes=0), {})  # type: ignore[arg-type]
        mine = Outcomes(a, grace_seconds=1, min_free_bytes=0)
        with mine.flight("req-1"):
            settled = await Reconciler(None, None, mine, {}).settle_stale_replicas()  # type: ignore[arg-type]
            assert [(s.request_id, s.action) for s in settled] == [("req-1", "in_flight")]
            assert name in await b.stale_replicas()  # not forgotten while a call of it is open
        settled = await others.settle_stale_replicas()
        assert [(s.request_id, s.action, s.owner) for s in settled] == [("req-1", "interrupted", name)]
        assert name not in await b.stale_replicas()

        # forgotten meanwhile, then paused again: the name comes back stale, so what was decided under it
        # between the two is settled too
        again = a.replica_id
        await a.append(rec(2, "received", None, effect="read"), rec(2))
        await con.execute("DELETE FROM audit_replicas WHERE replica = $1", again)
        with pytest.raises(auditlib.LeaseLost):
            await a.hold(again)
        assert again in await b.stale_replicas()
        settled = await others.settle_stale_replicas()
        assert [(s.request_id, s.action, s.owner) for s in settled] == [("req-2", "interrupted", again)]
    finally:
        await con.close()
        await a.close()
        await b.close()
    assert off(auditlib.verify, PgLocation(url), key=key).ok


async def test_a_heartbeat_that_finds_its_row_too_old_gives_the_name_up(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Not only a mutation's check: a commit's heartbeat that cannot renew the row (paused, cut off)
    marks the name lost, and the heartbeat loop takes a new one within a heartbeat."""
    url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    con = await asyncpg.connect(url)
    try:
        name = a.replica_id
        await age(con, name, auditlib.LEASE_SECONDS + 1)
        await a.probe()  # a commit with a heartbeat: the row is not renewed, the name is marked lost
        deadline = time.monotonic() + 3 * auditlib.HEARTBEAT_SECONDS
        while a.replica_id == name and time.monotonic() < deadline:  # the heartbeat loop renames it
            await asyncio.sleep(0.1)
        assert a.replica_id != name and a.leases_lost == 1 and a._lost_name is None
        assert a.replica_id in (await b.live_replicas() or set())
        assert await con.fetchval("SELECT count(*) FROM audit_replicas WHERE replica = $1", name) == 1  # kept
        await asyncio.sleep(auditlib.HEARTBEAT_SECONDS + 1)
        assert a.leases_lost == 1  # renamed once, not again
    finally:
        await con.close()
        await a.close()
        await b.close()


async def test_a_renewal_not_yet_committed_wins_over_a_settlement(postgres: PostgresServer, tmp_path: Path) -> None:
    """A heartbeat renewed in a transaction that has not committed yet (a slow commit, a pause right
    before it) must not lose to another replica that read the old, stale time: claiming a gone
    replica waits for the row and sees the renewal. Once claimed, the name can never be renewed."""
    url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    con, late = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        name = a.replica_id
        await age(con, name, 31.0)
        assert name in await b.stale_replicas()  # what another replica's pass reads
        tx = late.transaction()
        await tx.start()  # the renewal, made before the row went stale, committing late
        await late.execute(
            "UPDATE audit_replicas SET seen_at = extract(epoch FROM clock_timestamp())::float8 WHERE replica = $1", name
        )
        claim = asyncio.create_task(b.claim_gone({name}))
        await asyncio.sleep(0.5)
        assert not claim.done()  # it waits for the row
        await tx.commit()
        assert await claim == set()  # renewed: not gone
        await age(con, name, 31.0)
        # a name with no row is claimed only by the holder of the reconcile lock; a row once claimed too
        assert await b.claim_gone({name, "forgotten:1:00000000"}) == {name}
        assert await b.claim_gone({name, "forgotten:1:00000000"}) == set()  # claimed already: nobody wins twice
        async with b.exclusive("pvegate-reconcile") as turn:
            assert await b.claim_gone({name, "forgotten:1:00000000"}, turn) == {name, "forgotten:1:00000000"}
        with pytest.raises(auditlib.LeaseLost):  # claimed: never renewed again
            await a.hold(name)
    finally:
        await con.close()
        await late.close()
        await a.close()
        await b.close()


def stop_server(server: PostgresServer) -> list[str]:
    """Stop the server (fast shutdown: connections cut), keeping its data: the argv to start it again."""
    argv = [str(a) for a in server.proc.args]  # type: ignore[union-attr]
    server.proc.send_signal(signal.SIGINT)
    server.proc.wait(timeout=20)
    return argv


def start_server(server: PostgresServer, argv: list[str]) -> None:
    """Start it again on the same port and data (as the account tests/pgserver.py runs it as)."""
    owner = server.root.stat()
    as_owner: dict[str, Any] = {}
    if owner.st_uid != os.geteuid():
        as_owner = {"user": owner.st_uid, "group": owner.st_gid, "extra_groups": []}
    with open(server.root / "server.log", "ab") as log:
        server.proc = subprocess.Popen(
            argv,
            cwd=server.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=die_with_parent(signal.SIGINT),  # as tests/pgserver.py: never outlives the test process
            **as_owner,
        )
    pid_file = server.root / "data" / "postmaster.pid"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = pid_file.read_text().splitlines() if pid_file.exists() else []
        if len(lines) >= 8 and lines[7].strip() == "ready":
            return
        time.sleep(0.05)
    raise AssertionError("postgres did not come back:\n" + server.log()[-2000:])


def _restart(server: PostgresServer, down_for: float) -> None:
    argv = stop_server(server)
    time.sleep(down_for)
    start_server(server, argv)


async def test_postgresql_restarted_under_load_refuses_then_serves_again_without_a_restart(tmp_path: Path) -> None:
    server = start_postgres()  # its own server: the session's is shared by other tests
    try:
        key = tmp_path / "audit-head.key"
        url = await new_pg_database(server, key=key)
        log = AuditLog(PgLocation(url), head_key=key)
        await log.open()
        outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
        written, refused = 0, 0
        held, not_held = 0, 0
        ids: list[str] = []
        stop = False

        async def holds() -> None:  # the check before every mutation: refused while down, never a lost name
            nonlocal held, not_held
            while not stop:
                try:
                    await outcomes.hold(log.replica_id)
                    held += 1
                except ClaimLost as exc:
                    raise AssertionError(f"a one-second outage is no lost name: {exc}") from exc
                except AuditUnavailable as exc:
                    assert "audit store cannot take writes" in str(exc)
                    not_held += 1
                await asyncio.sleep(0.02)

        async def load() -> None:
            nonlocal written, refused
            i = 0
            while not stop:
                i += 1
                try:
                    await outcomes.append(rec(i))
                    written += 1
                    ids.append(f"req-{i}")
                except AuditUnavailable as exc:
                    assert "audit store cannot take writes" in str(exc)
                    refused += 1
                    await asyncio.sleep(0.02)

        try:
            runner = asyncio.create_task(load())
            checker = asyncio.create_task(holds())
            await asyncio.sleep(0.3)
            before = written
            await asyncio.to_thread(_restart, server, 1.0)
            assert refused > 0  # while it was down: refused, never written elsewhere or dropped silently
            assert not_held > 0
            held_before = held
            t0 = time.monotonic()
            # served again, same pool, no restart: writes and the hold before a mutation both (the loop waited for
            # the writes alone, and the holds checker, between two sleeps, could be one step behind: a flake)
            while (written <= before + 20 or held <= held_before) and time.monotonic() - t0 < 20:
                await asyncio.sleep(0.05)
            stop = True
            await runner
            await checker
            assert written > before + 20 and held > held_before
            assert log.last_error is None and outcomes.store_ok()
            await log.probe()
        finally:
            stop = True
            for task in (runner, checker):
                with contextlib.suppress(Exception):
                    await task
            await log.close()
        res = off(auditlib.verify, PgLocation(url), key=key)
        assert res.ok, res.problem
        # every record a caller was told is written is in the one chain; a commit whose answer was lost with
        # the connection may be there too, its caller refused (more in the audit than ran, never less)
        chain = [r["request_id"] for r in off(auditlib.search, PgLocation(url), auditlib.Query())]
        assert set(ids) <= set(chain) and written <= res.checked <= written + 2
    finally:
        server.stop()


async def test_a_store_error_is_the_stores_not_the_records(postgres: PostgresServer, tmp_path: Path) -> None:
    """PostgreSQL unreachable is AuditStoreError (every caller refused, readiness red), never a record's fault."""
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    log = AuditLog(PgLocation(url), head_key=key)
    await log.open()
    try:
        admin = await asyncpg.connect(postgres.dsn)
        try:  # cut every connection of the gateway's pool, and keep new ones out
            name = url.rsplit("/", 1)[1]
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
            with pytest.raises(AuditStoreError):
                await log.append(rec(1))
            assert log.last_error is not None
            with pytest.raises(AuditStoreError):
                await log.probe()
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        finally:
            await admin.close()
        await log.append(rec(2))
        assert log.last_error is None
    finally:
        await log.close()


async def test_a_postgresql_database_of_the_previous_release_gains_the_audit(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The release before the audit moved: approvals, quotas, keys and handoffs in PostgreSQL, the
    audit refused. `pvegate db upgrade` adds the audit (version 0 -> 1), keeps what was there, and
    the first replica seals the new chain."""
    from gateway.store import approvals, handoffs, shared_keys, usage
    from gateway.store.approvals import ApprovalStore
    from gateway.store.migrations import upgrade
    from tests.config.conftest import run_pvegate
    from tests.store.test_stores import request

    url = await postgres.create_database("p_")
    db = PostgresDatabase(url)
    await db.open()
    try:  # what the previous release's `pvegate db upgrade` made
        for component, migrations in (
            ("approvals", approvals.MIGRATIONS),
            ("usage", usage.MIGRATIONS),
            ("keys", shared_keys.MIGRATIONS),
            ("handoffs", {k: v[:1] for k, v in handoffs.MIGRATIONS.items()}),  # before console sign-outs
        ):
            await upgrade(db, component, migrations)
    finally:
        await db.close()
    store = ApprovalStore(PostgresDatabase(url))
    await store.open()
    pending, _ = await store.find_or_create(request())
    await store.close()
    key = tmp_path / "state" / "audit-head.key"
    log = AuditLog(PgLocation(url), head_key=key)
    with pytest.raises(SchemaError, match="audit schema in the database is version 0"):
        await log.open()
    await log.close()

    raw = minimal(tmp_path)
    raw["storage"] = {"url": url}
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(write(tmp_path, raw)))
    assert r.returncode == 0, r.stderr
    assert "audit: version 0 -> 1" in r.stdout and "approvals: version 1, up to date" in r.stdout, r.stdout
    assert "handoffs: version 1 -> 3" in r.stdout, r.stdout
    assert key.exists()  # made once, here, for every replica
    log = AuditLog(PgLocation(url), head_key=key)
    await log.open()
    try:
        await log.append(rec(1))
    finally:
        await log.close()
    assert off(auditlib.verify, PgLocation(url), key=key).ok
    store = ApprovalStore(PostgresDatabase(url))
    await store.open()
    try:
        got = await store.get(pending.id)
        assert got is not None and got.state == "pending"
    finally:
        await store.close()


async def test_an_idle_replica_keeps_its_heartbeat_fresh(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No call, no readiness probe: the writer still refreshes its row, so its long calls stay its own."""
    monkeypatch.setattr(auditlib, "HEARTBEAT_SECONDS", 0.2)
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    log = AuditLog(PgLocation(url), head_key=key)
    await log.open()
    try:
        con = await asyncpg.connect(url)
        try:
            sql = "SELECT seen_at FROM audit_replicas WHERE replica = $1"
            first = await con.fetchval(sql, log.replica_id)
            deadline = time.monotonic() + 10  # a loaded machine: a few beats are due well before this
            while await con.fetchval(sql, log.replica_id) == first and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert await con.fetchval(sql, log.replica_id) > first
        finally:
            await con.close()
        assert log.replica_id in (await log.live_replicas() or set())
    finally:
        await log.close()


# --- the running gateway's own calls left open ------------------------------------------------------


async def test_a_pass_the_store_cuts_short_keeps_every_call_it_did_not_settle(tmp_path: Path) -> None:
    """SQLite on a real full disk: the pass over this process's own open calls cannot write their
    results. Every one stays to be settled (none dropped after the first failed write), and the next
    pass, with space back, settles them all."""
    from tests.outcomes.helpers import fill, tmpfs

    with tmpfs(tmp_path / "disk") as disk:
        log = AuditLog(disk / "audit.db")
        await log.open()
        try:
            for i in (1, 2, 3):  # reads: settled without asking Proxmox
                await log.append(rec(i, "received", None, effect="read"), rec(i))
            outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
            outcomes.unsettled |= {"req-1", "req-2", "req-3"}
            reconciler = Reconciler(None, None, outcomes, {})  # type: ignore[arg-type]
            ballast = fill(disk)
            settled = await reconciler.settle_own(0)
            assert [(s.request_id, s.action) for s in settled or []] == [(f"req-{i}", "open") for i in (1, 2, 3)]
            assert outcomes.unsettled == {"req-1", "req-2", "req-3"}
            ballast.unlink()
            settled = await reconciler.settle_own(0)
            assert [(s.request_id, s.action) for s in settled or []] == [(f"req-{i}", "interrupted") for i in (1, 2, 3)]
            assert outcomes.unsettled == set()
            assert await reconciler.settle_own(0) == []
        finally:
            await log.close()


class _SlowWrites(Reconciler):
    """Writes each result a little late: a pass that reads the open calls without the others' lock
    then overlaps another replica's pass."""

    async def _write(self, *args: Any) -> None:
        await asyncio.sleep(0.3)
        await super()._write(*args)


async def test_a_replica_and_the_one_that_claimed_its_name_settle_a_call_once(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Replica A left a call open for itself to settle (`interrupted`), then lost the database long
    enough to go stale; when it is back, B claims A's name and settles A's calls while A's own pass
    runs. One of them settles the call, once."""
    url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    con = await asyncpg.connect(url)
    try:
        await a.append(rec(1, "received", None, effect="read"), rec(1))
        mine = Outcomes(a, grace_seconds=1, min_free_bytes=0)
        mine.unsettled.add("req-1")
        await age(con, a.replica_id, auditlib.REPLICA_STALE_SECONDS + 1)
        ra = _SlowWrites(None, None, mine, {})  # type: ignore[arg-type]
        rb = _SlowWrites(None, None, Outcomes(b, grace_seconds=1, min_free_bytes=0), {})  # type: ignore[arg-type]
        for _ in range(2):  # a pass that found the lock taken leaves the call for the next one
            await asyncio.gather(rb.settle_stale_replicas(), ra.settle_own(0))
        rows = await con.fetch("SELECT kind, outcome FROM audit WHERE request_id = 'req-1' AND kind = 'result'")
        assert [(r["kind"], r["outcome"]) for r in rows] == [("result", "interrupted")]
        assert mine.unsettled == set()
    finally:
        await con.close()
        await a.close()
        await b.close()


# --- a call's secret values are scrubbed as data; verify checks the schema version (both backends) ----------


async def test_a_call_secret_never_rewrites_the_principal_or_the_json_of_its_records(store: Store) -> None:
    """Whatever a client picks as its password (its own name, a piece of JSON), its records keep their
    principal and stay JSON, the kept policy input unpacks, and the secret is still not written."""
    from gateway.store.audit import CALL_SECRETS

    log = store.log(secrets=["GatewayOwnSecret-12345"])
    await log.open()
    secrets = ("mallory-agent", '{"error":', '{"approval":null,', '{"allow":true,', "pw-Hunter22", "123456")
    try:
        for i, secret in enumerate(secrets):
            CALL_SECRETS.set((secret,))
            args = {"vmid": 100 + i, "cipassword": "[redacted]"}
            doc = {"principal": {"sub": "mallory-agent"}, "arguments": args, "approval": None, "n": 123456}
            await log.append(
                AuditRecord(f"r{i}", "received", "mallory-agent", "vm_cloudinit_set", "default/qemu/1", None, {"a": 1}),
                AuditRecord(
                    f"r{i}",
                    "decision",
                    "mallory-agent",
                    "vm_cloudinit_set",
                    "default/qemu/1",
                    "allow",
                    {
                        "allow": True,
                        "risk": {"level": "low"},
                        "note": f"saw {secret} in an error",
                        "gw": "GatewayOwnSecret-12345",
                    },
                    policy_input=doc,
                ),
                AuditRecord(f"r{i}", "refusal", "mallory-agent", "vm_cloudinit_set", None, "invalid", {"error": "x"}),
            )
        CALL_SECRETS.set(())
    finally:
        await log.close()
    rows = off(auditlib.search, store.where, auditlib.Query(principal="mallory-agent"))
    assert len(rows) == 3 * len(secrets)  # none hidden from a search by principal
    for row in rows:
        body = json.loads(row["body"])  # every body is JSON
        assert row["tool"] == "vm_cloudinit_set" and isinstance(body, dict)
        assert "pw-Hunter22" not in row["body"] and "GatewayOwnSecret" not in row["body"]
        if row["kind"] == "decision":
            kept = auditlib.unpack_input(body)
            assert kept is not None and kept["principal"]["sub"] == "mallory-agent"  # stated by the column anyway
            assert body["allow"] is True and body["risk"] == {"level": "low"} and body["gw"] == "[redacted]"
            assert kept["approval"] is None and "arguments" in kept
            secret = secrets[int(row["request_id"][1:])]
            scrubbed = secret != "mallory-agent"  # the caller's own name is no secret of its record
            assert body["note"] == ("saw [redacted] in an error" if scrubbed else f"saw {secret} in an error")
            assert kept["n"] == ("[redacted]" if secret == "123456" else 123456)  # a number that is the secret
    assert [json.loads(auditlib.export_line(r))["seq"] for r in rows] == [r["seq"] for r in rows]
    assert off(auditlib.verify, store.where, key=store.key).ok


async def test_verify_fails_on_an_audit_schema_newer_than_this_pvegate(store: Store) -> None:
    await filled(store, 1)
    assert off(auditlib.verify, store.where, key=store.key).ok
    store.sql("UPDATE pvegate_schema SET version = 99 WHERE component = 'audit'")
    res = off(auditlib.verify, store.where, key=store.key)
    assert not res.ok and "audit schema in the database is version 99, newer than this pvegate" in str(res.problem)
