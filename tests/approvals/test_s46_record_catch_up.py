"""Supersessions and give-backs have one `approval` record too, however it gets written (found by a review):

- a request superseded after a policy change is recorded `superseded` (under the superseding call's request id,
  naming it in approval_id); a later process's first sweep used to take it for an expiry whose record was missing
  and add an `expired` one. Now it is recognised; and when the `superseded` record itself failed, the catch-up
  writes that record, once;
- a `release` (the consumed approval given back: `released`; or ended because its withdrawal was asked for while
  the call held it: `withdrawn`) whose record failed after its commit was never caught up. Now the next sweep
  writes it, once, as it does for votes, expiries and withdrawals; and a replica's catch-up racing the writer
  leaves one record.

Real SQLite files and a real PostgreSQL (two replicas: each its own pool and audit writer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.core.calls import CallRequest
from gateway.policy.decisions import Decision
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.approvals import (
    APPROVAL_META_KEY,
    ApprovalRequest,
    Approvals,
    ApprovalStore,
)
from gateway.store.audit import AuditClosed
from gateway.store.db import SqliteDatabase
from gateway.tools.catalog import Catalog
from gateway.tools.tool import Tool
from tests.approvals.replicas import Replicas, catch_up_when_writes_resume, parsed, reopened, replicas_on
from tests.store.test_stores import DIGEST, TARGET, approved, person
from tests.support import audit_rows

pytestmark = pytest.mark.asyncio

ARGS = {"vmid": 100}
END = ("expired", "superseded")  # the outcomes a supersession's record could have


def _tool() -> Tool:
    tool = Catalog.load(REPO_ROOT / "connectors").get("vm_shutdown")
    assert tool is not None
    return tool


def _decision(groups: list[str]) -> Decision:
    return Decision(False, (), approval={"reason": "prod", "approver_groups": groups})


async def _hold(approvals: Approvals, call_id: str, groups: list[str]) -> None:
    """The agent's call held for an approval by `groups` (the policy's answer at the time)."""
    call = CallRequest(call_id, person("agent"), "vm_shutdown", dict(ARGS), "2025-06-18")
    await approvals.pending_result(
        call, _tool(), dict(ARGS), "digest", {"cluster": "c", "vmid": 100}, _decision(groups)
    )


class Paused(ApprovalStore):
    """Supersessions and releases held between their commit and their record (`after_commit`), and the catch-up's
    looks for missing records held before their writing (`after_lookup`): the windows two replicas race in."""

    after_commit: Callable[[], Awaitable[None]] | None = None
    after_lookup: Callable[[], Awaitable[None]] | None = None

    async def find_or_replace(self, req: ApprovalRequest) -> tuple[ApprovalRequest, bool, Sequence[tuple[str, str]]]:
        out = await super().find_or_replace(req)
        if out[2] and self.after_commit is not None:
            await self.after_commit()
        return out

    async def release(self, approval_id: str, used_by: str) -> str | None:
        out = await super().release(approval_id, used_by)
        if self.after_commit is not None:
            await self.after_commit()
        return out

    async def _looked(self, found: list[Any]) -> list[Any]:
        if found and self.after_lookup is not None:
            await self.after_lookup()
        return found

    async def unrecorded_supersessions(self, since: float) -> list[dict[str, Any]]:
        return await self._looked(await super().unrecorded_supersessions(since))


@pytest.fixture(params=["sqlite", "postgres"])
async def replicas(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Replicas[Paused]]:
    async with replicas_on(request, tmp_path, Paused) as made:
        yield made


async def _superseded(store: ApprovalStore) -> tuple[str, str]:
    """(the old request's id, the new one's): the call held under the old policy, then under the new."""
    (old,) = await store.list("expired")
    (new,) = await store.list("pending")
    assert f"superseded by {new.id}" in str(old.note)
    return old.id, new.id


async def _ends(replicas: Replicas[Paused], approval_id: str) -> list[dict[str, Any]]:
    """The records ending `approval_id` by a supersession (or an expiry), wherever they are keyed."""
    return [r for r in await replicas.rows() if r["outcome"] in END and r["body"].get("approval_id") == approval_id]


# --- supersessions ---------------------------------------------------------------------------


async def test_s46_a_supersession_recorded_in_time_is_not_recorded_again_by_a_new_process(
    replicas: Replicas[Paused],
) -> None:
    """The live process writes `superseded`; a new process's first sweep (fresh store and audit objects on the
    same database, as after a restart) writes no `expired` record for the superseded request."""
    await _hold(replicas.a, "call-1", ["sre-leads"])
    await _hold(replicas.a, "call-2", ["ops-approvers"])  # the rollout: other approvers
    old, new = await _superseded(replicas.store_a)
    await replicas.b.expire_due()  # the new process's first sweep
    await replicas.b.expire_due()
    ends = await _ends(replicas, old)
    assert [(r["request_id"], r["outcome"]) for r in ends] == [("call-2", "superseded")], ends
    assert ends[0]["body"]["superseded_by"] == new


async def test_s46_a_supersession_whose_record_failed_is_recorded_by_the_next_sweep_once(tmp_path: Path) -> None:
    """The supersession is committed, then its record fails (the audit refusing writes): the next sweep writes the
    record that failed, `superseded`, as it would have been written (under the superseding call, naming both
    requests and why), once; and a later process's first sweep adds nothing."""
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    approvals = Approvals(store, await reopened(path))
    try:
        await _hold(approvals, "call-1", ["sre-leads"])
        assert approvals.audit is not None
        await approvals.audit.close()  # the audit refuses writes from here
        with pytest.raises(AuditClosed):
            await _hold(approvals, "call-2", ["ops-approvers"])
        old, new = await _superseded(store)  # committed before its record failed
        await catch_up_when_writes_resume(approvals, path)
        note = (await store.get(old)).note
    finally:
        await store.close()
    rows = parsed([r for r in audit_rows(path) if r["kind"] == "approval"])
    ends = [r for r in rows if r["outcome"] in END and r["body"].get("approval_id") == old]
    assert [(r["request_id"], r["outcome"]) for r in ends] == [("call-2", "superseded")], ends
    body = ends[0]["body"]
    assert body["superseded_by"] == new and body["note"] == note and body["recorded_late"], body
    assert body["superseded_at"]
    assert [r["outcome"] for r in rows if r["request_id"] == "call-2"] == ["requested", "superseded"], rows


async def test_s46_a_catch_up_between_a_supersession_and_its_record_leaves_one_record(
    replicas: Replicas[Paused],
) -> None:
    """A supersedes a request and stalls before its records; B starts, and its first sweep records what is missing;
    then A writes its own: one `superseded` record, and no `expired` one."""
    await _hold(replicas.a, "call-1", ["sre-leads"])

    async def b_starts() -> None:
        await replicas.b.expire_due()

    replicas.store_a.after_commit = b_starts
    await _hold(replicas.a, "call-2", ["ops-approvers"])
    old, _new = await _superseded(replicas.store_a)
    ends = await _ends(replicas, old)
    assert [r["outcome"] for r in ends] == ["superseded"], ends
    assert ends[0]["request_id"] == "call-2" and ends[0]["body"]["recorded_late"]  # B's: A's own was not added
    assert len(await replicas.under("call-2", "requested")) == 1


async def test_s46_a_supersession_catch_up_whose_record_is_written_meanwhile_leaves_one_record(
    replicas: Replicas[Paused],
) -> None:
    """B's first sweep finds A's supersession unrecorded; before B appends, A writes its record: B's append, tested
    again under the chain's append lock, writes nothing."""
    await _hold(replicas.a, "call-1", ["sre-leads"])
    committed, go = asyncio.Event(), asyncio.Event()

    async def a_stalls() -> None:
        committed.set()
        await go.wait()

    replicas.store_a.after_commit = a_stalls
    a = asyncio.create_task(_hold(replicas.a, "call-2", ["ops-approvers"]))
    await committed.wait()

    looked: list[bool] = []

    async def a_records_now() -> None:
        looked.append(True)
        go.set()
        await a

    replicas.store_b.after_lookup = a_records_now
    try:
        await replicas.b.expire_due()
    finally:
        go.set()
        await asyncio.gather(a, return_exceptions=True)
    old, _new = await _superseded(replicas.store_a)
    ends = await _ends(replicas, old)
    assert looked and [r["outcome"] for r in ends] == ["superseded"], ends
    assert "recorded_late" not in ends[0]["body"]  # A's: B's append found it


# --- releases ----------------------------------------------------------------------------------


async def _consumed(approvals: Approvals, call_id: str) -> str:
    """An approved request whose token call `call_id` presented (and so consumed): its id."""
    store = approvals.store
    assert store is not None
    aid, token = await approved(store)
    facts, why = await approvals.redeem(
        {APPROVAL_META_KEY: token}, person("agent"), "vm_shutdown", DIGEST, TARGET, request_id=call_id
    )
    assert facts is not None and why is None, why
    return aid


async def _release(approvals: Approvals, aid: str, call_id: str) -> bool:
    return await approvals.release(aid, person("agent"), "vm_shutdown", TARGET, call_id, "refused by the policy")


@pytest.mark.parametrize("withdrawn", [False, True], ids=["given-back", "withdrawn-in-use"])
async def test_s46_a_release_whose_record_failed_is_recorded_by_the_next_sweep_once(
    tmp_path: Path, withdrawn: bool
) -> None:
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    approvals = Approvals(store, await reopened(path))
    try:
        assert await approvals.expire_due() == []  # the start-up sweep
        aid = await _consumed(approvals, "call-1")
        if withdrawn:  # asked for while the call held it: the release ends it withdrawn
            assert not (await approvals.withdraw(aid, "operator", "changed my mind")).ok
        assert approvals.audit is not None
        await approvals.audit.close()  # the audit refuses writes from here
        with pytest.raises(AuditClosed):
            await _release(approvals, aid, "call-1")
        state = (await store.get(aid)).state  # committed before its record failed
        assert state == ("withdrawn" if withdrawn else "approved")
        await catch_up_when_writes_resume(approvals, path)
    finally:
        await store.close()
    rows = [r for r in audit_rows(path, "call-1") if r["kind"] == "approval"]
    want = "withdrawn" if withdrawn else "released"
    assert [(r["principal"], r["outcome"]) for r in rows] == [("agent", "consumed"), ("agent", want)], rows
    body = json.loads(str(rows[1]["body"]))
    assert body["approval_id"] == aid and body["recorded_late"], body
    if withdrawn:
        assert body["released_at"] and body["withdrawn"]
    # the withdrawal's own refusal is under the approval's id; no `withdrawn` record was added there
    assert "withdrawn" not in [r["outcome"] for r in audit_rows(path, aid) if r["kind"] == "approval"]


async def test_s46_a_release_recorded_in_time_or_a_sent_call_adds_nothing_at_the_next_start(
    replicas: Replicas[Paused],
) -> None:
    """Given back and recorded; consumed and sent (it stays used); given back, consumed again and sent: a new
    process's first sweep writes no record for any of them."""
    back = await _consumed(replicas.a, "call-1")
    assert await _release(replicas.a, back, "call-1")
    sent = await _consumed(replicas.a, "call-2")
    again = await _consumed(replicas.a, "call-3")
    assert await _release(replicas.a, again, "call-3")
    store = replicas.store_a
    facts, _ = await replicas.a.redeem(
        {"pvegate/approval_request": again}, person("agent"), "vm_shutdown", DIGEST, TARGET, request_id="call-4"
    )
    assert facts is not None
    # (requests and votes were made on the store directly: B records those late, which is not in question here)
    release = ("consumed", "released", "withdrawn", "expired")
    before = [r for r in await replicas.rows() if r["outcome"] in release]
    await replicas.b.expire_due()
    assert [r for r in await replicas.rows() if r["outcome"] in release] == before
    assert (await store.get(sent)).state == "used"


async def test_s46_a_catch_up_between_a_release_and_its_record_leaves_one_record(replicas: Replicas[Paused]) -> None:
    """Another process's sweep between a release's commit and its record writes nothing for it (a give-back
    leaves no trace it could find without reading the audit by time): the releasing process's own record,
    once."""
    aid = await _consumed(replicas.a, "call-1")

    async def b_starts() -> None:
        await replicas.b.expire_due()

    replicas.store_a.after_commit = b_starts
    assert await _release(replicas.a, aid, "call-1")
    (rec,) = await replicas.under("call-1", "released")
    assert rec["body"]["approval_id"] == aid and "recorded_late" not in rec["body"]


async def test_s46_a_release_that_ended_an_approval_is_recorded_by_a_new_process_once(tmp_path: Path) -> None:
    """A withdrawal asked for while a call held the approval, made real by the call's release, whose record failed
    and whose process then died: the row keeps its holder, so the next process's first sweep writes the
    `withdrawn` record under the call's id, once. (A plain give-back leaves no trace a new process could find.)"""
    path = tmp_path / "audit.db"
    store = ApprovalStore(SqliteDatabase(path))
    await store.open()
    approvals = Approvals(store, await reopened(path))
    try:
        assert await approvals.expire_due() == []
        aid = await _consumed(approvals, "call-1")
        assert not (await approvals.withdraw(aid, "operator", "changed my mind")).ok
        assert approvals.audit is not None
        await approvals.audit.close()
        with pytest.raises(AuditClosed):
            await _release(approvals, aid, "call-1")
        # the process dies here: its memory of the release is gone
        for _ in range(2):
            restarted = Approvals(store, await reopened(path))
            await restarted.expire_due()
            assert restarted.audit is not None
            await restarted.audit.close()
    finally:
        await store.close()
    rows = [r for r in audit_rows(path, "call-1") if r["kind"] == "approval"]
    assert [(r["principal"], r["outcome"]) for r in rows] == [("agent", "consumed"), ("agent", "withdrawn")], rows
    body = json.loads(str(rows[1]["body"]))
    assert body["approval_id"] == aid and body["recorded_late"] and body["withdrawn"] and body["released_at"], body
