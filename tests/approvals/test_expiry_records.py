"""Each expiry has its `approval` record `expired`, even when the sweep that expired it could not write it
(found by a review: the state change was committed, the record failed, and no later sweep looked again),
and the record is the expired approval's own: never scrubbed with the secret values of whichever call
happened to run the sweep. A real SQLite file holding the approvals and the audit, as a gateway has."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from gateway.store.approvals import Approvals, ApprovalStore
from gateway.store.audit import CALL_SECRETS, AuditClosed, AuditLog
from gateway.store.db import PostgresDatabase, SqliteDatabase
from gateway.store.pgsync import PgLocation
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database
from tests.store.test_stores import person, request
from tests.support import audit_rows

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    s = ApprovalStore(SqliteDatabase(tmp_path / "audit.db"))
    await s.open()
    yield s
    await s.close()


async def _opened(path: Path) -> AuditLog:
    audit = AuditLog(path)
    await audit.open()
    return audit


def _expired_records(path: Path, approval_id: str) -> list[dict[str, object]]:
    rows = audit_rows(path, approval_id)
    return [json.loads(str(r["body"])) for r in rows if r["kind"] == "approval" and r["outcome"] == "expired"]


async def _due(store: ApprovalStore) -> str:
    req, created = await store.find_or_create(request(expires_in=1))
    assert created
    await asyncio.sleep(1.2)  # past its expiry on the database's clock
    return req.id


async def test_an_expiry_whose_record_failed_is_recorded_by_the_next_sweep(
    store: ApprovalStore, tmp_path: Path
) -> None:
    path = tmp_path / "audit.db"
    audit = await _opened(path)
    approvals = Approvals(store, audit)
    assert await approvals.expire_due() == []  # the start-up sweep
    aid = await _due(store)
    await audit.close()  # the audit refuses writes from here
    with pytest.raises(AuditClosed):
        await approvals.expire_due()
    assert (await store.get(aid)).state == "expired"  # the state change was committed before the record failed
    assert _expired_records(path, aid) == []
    approvals.audit = await _opened(path)  # the audit takes writes again
    try:
        assert await approvals.expire_due() == [aid]
        assert await approvals.expire_due() == []  # once
    finally:
        await approvals.audit.close()
    (record,) = _expired_records(path, aid)
    assert record["approval_id"] == aid and record["was"] == "pending"


async def test_an_expiry_left_unrecorded_by_a_dead_process_is_recorded_at_the_next_start(
    store: ApprovalStore, tmp_path: Path
) -> None:
    path = tmp_path / "audit.db"
    audit = await _opened(path)
    aid = await _due(store)
    await audit.close()
    with pytest.raises(AuditClosed):
        await Approvals(store, audit).expire_due()  # the process then died: nothing remembers the miss
    restarted = Approvals(store, await _opened(path))
    try:
        assert await restarted.expire_due() == [aid]
    finally:
        assert restarted.audit is not None
        await restarted.audit.close()
    assert len(_expired_records(path, aid)) == 1


async def test_a_sweep_run_by_a_call_does_not_scrub_other_records_with_its_secrets(
    store: ApprovalStore, tmp_path: Path
) -> None:
    path = tmp_path / "audit.db"
    approvals = Approvals(store, await _opened(path))
    try:
        aid = await _due(store)
        CALL_SECRETS.set(("pending",))  # the calling client's password, as the pipeline sets it for its call
        assert await approvals.expire_due() == [aid]
        assert CALL_SECRETS.get() == ("pending",)  # the call's own records are still scrubbed
    finally:
        assert approvals.audit is not None
        await approvals.audit.close()
    (record,) = _expired_records(path, aid)
    assert record["was"] == "pending", record  # another principal's record: not "[redacted]"


async def test_a_vote_whose_record_failed_is_recorded_by_a_later_sweep(store: ApprovalStore, tmp_path: Path) -> None:
    """The vote was committed and its record failed (on PostgreSQL: the chain's head held past its lock
    timeout), then the process died: the next start's sweep writes who voted what, marked late."""
    path = tmp_path / "audit.db"
    req, _ = await store.find_or_create(request())
    out = await store.vote(req.id, person("alice"), "approve", None, None, ["sre-leads"])  # its record: never written
    assert out.ok
    restarted = Approvals(store, await _opened(path))
    try:
        assert await restarted.expire_due() == []
        await restarted.expire_due()  # once
    finally:
        assert restarted.audit is not None
        await restarted.audit.close()
    rows = [r for r in audit_rows(path, req.id) if r["kind"] == "approval"]
    assert [(r["principal"], r["outcome"]) for r in rows] == [("alice", "approved")], rows
    body = json.loads(str(rows[0]["body"]))
    assert body["verdict"] == "approve" and body["recorded_late"] and body["voted_at"]


async def test_a_sweep_reads_and_expires_each_due_request_in_one_statement(
    store: ApprovalStore, tmp_path: Path
) -> None:
    """The sweep's one conditional UPDATE both expires the due requests and returns what their records need:
    no SELECT of the due ids before it, no read of each expired row (and its votes) again after it."""
    path = tmp_path / "audit.db"
    approvals = Approvals(store, await _opened(path))
    try:
        assert await approvals.expire_due() == []  # the start-up sweep (its look for unrecorded expiries)
        ids = set()
        for i in range(3):  # three calls (an identical one would join the first's pending request)
            req, created = await store.find_or_create(request(expires_in=1, digest=f"d{i}"))
            assert created
            ids.add(req.id)
        await asyncio.sleep(1.2)
        assert isinstance(store.database, SqliteDatabase)
        seen: list[str] = []
        await store.database.db.set_trace_callback(seen.append)  # the real connection's statements
        try:
            assert set(await approvals.expire_due()) == ids
        finally:
            await store.database.db.set_trace_callback(lambda _stmt: None)
        touching = [" ".join(s.split()) for s in seen if "approval_" in s]
        assert len(touching) == 1 and touching[0].startswith("UPDATE approval_requests"), touching
    finally:
        assert approvals.audit is not None
        await approvals.audit.close()
    for aid in ids:
        (record,) = _expired_records(path, aid)
        assert record["was"] == "pending" and record["approval_id"] == aid


async def test_two_replicas_sweeping_at_once_expire_and_record_each_request_once(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """Two replicas (each its own pool and audit writer on one PostgreSQL database) sweep the same due requests
    at the same moment: each request is expired by one of them, and has one `expired` record."""
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    replicas: list[Approvals] = []
    try:
        for _ in range(2):
            store = ApprovalStore(PostgresDatabase(url))
            await store.open()
            audit = AuditLog(PgLocation(url), head_key=key)
            await audit.open()
            replicas.append(Approvals(store, audit))
        for r in replicas:
            assert await r.expire_due() == []  # start-up sweeps: nothing due, nothing unrecorded
        first = replicas[0].store
        assert first is not None
        ids = set()
        for i in range(20):
            req, created = await first.find_or_create(request(expires_in=1, digest=f"d{i}"))
            assert created
            ids.add(req.id)
        await asyncio.sleep(1.2)
        for _ in range(3):  # the same moment, more than once (only the first finds anything due)
            a, b = await asyncio.gather(*(r.expire_due() for r in replicas))
            assert not set(a) & set(b), (a, b)
            ids -= set(a) | set(b)
        assert ids == set()
    finally:
        for r in replicas:
            if r.audit is not None:
                await r.audit.close()
            await r.close()
    con = await asyncpg.connect(url)
    try:
        rows = await con.fetch(
            "SELECT request_id, count(*) AS n FROM audit WHERE kind = 'approval' AND outcome = 'expired' "
            "GROUP BY request_id"
        )
    finally:
        await con.close()
    assert len(rows) == 20 and all(r["n"] == 1 for r in rows), rows
