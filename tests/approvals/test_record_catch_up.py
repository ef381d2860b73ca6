"""A committed transition has one `approval` record, however its record gets written (found by a review):

- a withdrawal whose record failed (the audit refusing writes, the process dying in between) is recorded by
  the next sweep, as an expiry or a vote is, and only once;
- a replica's catch-up (its first sweep) that races the transition's own writer does not add a second record:
  each of them appends only if the record is still missing, tested under the chain's append lock.

Real SQLite files and a real PostgreSQL (two replicas: each its own pool and audit writer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.store.approvals import Approvals, ApprovalStore, Expiry, VoteOutcome
from gateway.store.audit import AuditClosed
from gateway.store.db import SqliteDatabase
from tests.approvals.replicas import Replicas, catch_up_when_writes_resume, reopened, replicas_on
from tests.store.test_stores import request
from tests.support import audit_rows

pytestmark = pytest.mark.asyncio


class Paused(ApprovalStore):
    """An ApprovalStore whose transitions can be held between their commit and their record (`after_commit`),
    and whose catch-up can be held between its look for missing records and their writing (`after_lookup`):
    the windows two replicas race in, made deterministic."""

    after_commit: Callable[[], Awaitable[None]] | None = None
    after_lookup: Callable[[], Awaitable[None]] | None = None

    async def expire_due_rows(self, now: float | None = None) -> list[Expiry]:
        rows = await super().expire_due_rows(now)
        if rows and self.after_commit is not None:
            await self.after_commit()
        return rows

    async def withdraw(self, request_id: str, by: str, note: str | None) -> VoteOutcome:
        out = await super().withdraw(request_id, by, note)
        if self.after_commit is not None:
            await self.after_commit()
        return out

    async def unrecorded_expiries(self, since: float) -> list[str]:
        ids = await super().unrecorded_expiries(since)
        if ids and self.after_lookup is not None:
            await self.after_lookup()
        return ids


@pytest.fixture(params=["sqlite", "postgres"])
async def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Replicas[Paused]]:
    async with replicas_on(request, tmp_path, Paused) as made:
        yield made


async def test_a_withdrawal_whose_record_failed_is_recorded_by_the_next_sweep_once(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    approvals = Approvals(store, await reopened(path))
    try:
        assert await approvals.expire_due() == []  # the start-up sweep
        req, _ = await store.find_or_create(request())
        assert approvals.audit is not None
        await approvals.audit.close()  # the audit refuses writes from here
        with pytest.raises(AuditClosed):
            await approvals.withdraw(req.id, "alice", "not needed")
        assert (await store.get(req.id)).state == "withdrawn"  # committed before its record failed
        await catch_up_when_writes_resume(approvals, path)
    finally:
        await store.close()
    rows = [r for r in audit_rows(path, req.id) if r["kind"] == "approval"]
    assert [(r["principal"], r["outcome"]) for r in rows] == [("alice", "withdrawn")], rows
    body = json.loads(str(rows[0]["body"]))
    assert body["note"] == "not needed" and body["recorded_late"] and body["withdrawn_at"]


async def test_a_withdrawal_recorded_in_time_is_not_recorded_again_at_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    try:
        approvals = Approvals(store, await reopened(path))
        req, _ = await store.find_or_create(request())
        assert (await approvals.withdraw(req.id, "alice")).ok
        assert approvals.audit is not None
        await approvals.audit.close()
        restarted = Approvals(store, await reopened(path))
        await restarted.expire_due()
        assert restarted.audit is not None
        await restarted.audit.close()
    finally:
        await store.close()
    outcomes = [r["outcome"] for r in audit_rows(path, req.id) if r["kind"] == "approval"]
    assert outcomes == ["withdrawn"]


async def test_a_catch_up_between_an_expiry_and_its_record_leaves_one_record(replicas: Replicas[Paused]) -> None:
    """A expires a request and stalls before its record; B starts, and its first sweep finds the expiry
    unrecorded and records it; then A writes its own: still one `expired` record."""
    req, _ = await replicas.store_a.find_or_create(request(expires_in=1))
    await asyncio.sleep(1.2)

    async def b_starts() -> None:
        await replicas.b.expire_due()

    replicas.store_a.after_commit = b_starts
    assert await replicas.a.expire_due() == [req.id]
    assert len(await replicas.records(req.id, "expired")) == 1


async def test_a_catch_up_whose_record_is_written_meanwhile_leaves_one_record(replicas: Replicas[Paused]) -> None:
    """B's first sweep finds A's expiry unrecorded; before B appends, A writes its record: B's append, tested
    again under the chain's append lock, writes nothing."""
    req, _ = await replicas.store_a.find_or_create(request(expires_in=1))
    await asyncio.sleep(1.2)
    committed, go = asyncio.Event(), asyncio.Event()

    async def a_stalls() -> None:
        committed.set()
        await go.wait()

    replicas.store_a.after_commit = a_stalls
    a = asyncio.create_task(replicas.a.expire_due())
    await committed.wait()
    store_b = replicas.b.store
    assert isinstance(store_b, Paused)

    async def a_records_now() -> None:
        go.set()
        assert await a == [req.id]

    store_b.after_lookup = a_records_now
    try:
        await replicas.b.expire_due()
    finally:
        go.set()
        await asyncio.gather(a, return_exceptions=True)
    assert len(await replicas.records(req.id, "expired")) == 1


async def test_a_catch_up_between_a_withdrawal_and_its_record_leaves_one_record(replicas: Replicas[Paused]) -> None:
    req, _ = await replicas.store_a.find_or_create(request())

    async def b_starts() -> None:
        await replicas.b.expire_due()

    replicas.store_a.after_commit = b_starts
    assert (await replicas.a.withdraw(req.id, "alice")).ok
    assert len(await replicas.records(req.id, "withdrawn")) == 1


async def test_a_request_left_unrecorded_by_a_dead_process_is_recorded_at_the_next_start_once(tmp_path: Path) -> None:
    """The held call's request was committed, then the process died before its `requested` record: approvers
    could vote on a request the audit never mentioned. The next start's sweep writes it, once."""
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    try:
        req, created = await store.find_or_create(request())  # its record: never written
        assert created
        for _ in range(2):  # two starts: one record
            restarted = Approvals(store, await reopened(path))
            await restarted.expire_due()
            assert restarted.audit is not None
            await restarted.audit.close()
    finally:
        await store.close()
    rows = [r for r in audit_rows(path, req.request_id) if r["kind"] == "approval"]
    assert [(r["principal"], r["outcome"]) for r in rows] == [(req.requester, "requested")], rows
    body = json.loads(str(rows[0]["body"]))
    assert body["approval_id"] == req.id and body["recorded_late"]


async def test_a_held_call_whose_request_record_failed_is_recorded_by_the_next_sweep(tmp_path: Path) -> None:
    """`pending_result` commits the request, then its `requested` record fails (the audit refusing writes): the
    same process's next sweep writes it, once, naming the request approvers see."""
    from gateway.core.calls import CallRequest
    from gateway.policy.decisions import Decision
    from gateway.policy.opa_sidecar import REPO_ROOT
    from gateway.tools.catalog import Catalog
    from tests.store.test_stores import person

    tool = Catalog.load(REPO_ROOT / "connectors").get("vm_shutdown")
    assert tool is not None
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    approvals = Approvals(store, await reopened(path))
    try:
        assert await approvals.expire_due() == []  # the start-up sweep
        assert approvals.audit is not None
        await approvals.audit.close()  # the audit refuses writes from here
        call = CallRequest("call-1", person("agent"), tool.name, {"vmid": 100}, "2025-06-18")
        decision = Decision(False, (), approval={"reason": "prod", "approver_groups": ["sre-leads"]})
        with pytest.raises(AuditClosed):
            await approvals.pending_result(call, tool, {"vmid": 100}, "digest", {"cluster": "c", "vmid": 100}, decision)
        (pending,) = await store.list("pending")  # committed before its record failed
        approvals.audit = await reopened(path)
        await approvals.expire_due()
        await approvals.expire_due()  # once
        await approvals.audit.close()
    finally:
        await store.close()
    rows = [r for r in audit_rows(path, "call-1") if r["kind"] == "approval"]
    assert [(r["principal"], r["outcome"]) for r in rows] == [("agent", "requested")], rows
    assert json.loads(str(rows[0]["body"]))["approval_id"] == pending.id
