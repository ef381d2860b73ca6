"""`audit archive` keeps an open call's records (test_s47_archive_keeps_open_call.py), and must keep the task
claims its reconciliation reads too: the records naming UPIDs from CLAIM_MARGIN_SECONDS before the call
(reconcile.claimed_tasks). Those are other calls' dispatch and result records; archived away, a task another
call started and recorded is free again, and the open call's task search could record it as its own. Found
by a hunt in stop 47 (with `--older-than` under about 7 days); the cut now stops the margin before the open
call. Records older than that are still archived."""

from __future__ import annotations

import time

import pytest

from gateway.store import audit as auditlib
from gateway.store import reconcile
from gateway.store.audit import AuditRecord
from tests.store.auditstore import AuditClock, Store, off

TARGET = {"cluster": "default", "kind": "qemu", "node": "pve1", "vmid": 100}


def upid(n: int) -> str:
    return f"UPID:pve1:0000{n:04X}:00000000:6750{n:04X}:qmstart:10{n}:root@pam!gw:"


async def test_archive_keeps_the_task_claims_an_open_call_is_reconciled_against(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = AuditClock.install(monkeypatch)
    start = clock.now
    log = store.log()
    await log.open()
    try:

        async def settled(request_id: str, n: int) -> None:
            for kind, outcome, body in (
                ("received", None, {}),
                ("decision", "allow", {}),
                ("dispatch", None, {"task_id": upid(n)}),
                ("result", "ok", {"task_id": upid(n)}),
            ):
                await log.append(
                    AuditRecord(request_id, kind, "alice", "start_vm", f"default/qemu/10{n}", outcome, body)
                )

        clock.now = start - 3 * 3600  # long before the open call: archived
        await settled("r-old", 1)
        clock.now = start - 1800  # half an hour before it: its task claim is read when it is reconciled
        await settled("r-near", 2)
        clock.now = start
        received = {"target": TARGET, "arguments": {"vmid": 100}, "effect": "mutate", "dry_run": False}
        await log.append(AuditRecord("r-open", "received", "alice", "start_vm", "default/qemu/100", None, received))
        await log.append(AuditRecord("r-open", "decision", "alice", "start_vm", "default/qemu/100", "allow", {}))
    finally:
        await log.close()
    monkeypatch.undo()
    res = off(auditlib.archive, store.where, time.time() + 1, store.root / "arch", key=store.key)
    assert res.file is not None and (res.first_seq, res.last_seq) == (1, 4), res  # r-old only
    calls = off(reconcile.open_calls, store.where, None, None)
    assert [c.request_id for c in calls] == ["r-open"]
    claimed = off(reconcile.claimed_tasks, store.where, calls[0].ts - reconcile.CLAIM_MARGIN_SECONDS)
    assert upid(2) in claimed, f"the archive took r-near's task claim: {claimed}"
    assert off(auditlib.verify, store.where, key=store.key).ok


async def test_a_lagging_writers_record_does_not_move_the_cut_past_a_claim(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records are in seq order, their times in each writer's clock: a record of a replica whose clock lags
    may follow a claim in seq and still be stamped before the margin. The cut stops before the first record
    stamped within the margin, not after the last one stamped before it (review of stop 48)."""
    clock = AuditClock.install(monkeypatch)
    start = clock.now
    log = store.log()
    await log.open()
    try:
        clock.now = start - 3 * 3600
        for kind, outcome in (("received", None), ("decision", "allow"), ("result", "ok")):
            await log.append(AuditRecord("r-old", kind, "alice", "start_vm", "default/qemu/101", outcome, {}))
        clock.now = start - 1200  # a claim twenty minutes before the open call
        for kind, outcome, body in (
            ("received", None, {}),
            ("decision", "allow", {}),
            ("dispatch", None, {"task_id": upid(2)}),
            ("result", "ok", {"task_id": upid(2)}),
        ):
            await log.append(AuditRecord("r-near", kind, "alice", "start_vm", "default/qemu/102", outcome, body))
        clock.now = start - 3900  # then a refusal by a replica whose clock lags 45 minutes
        await log.append(AuditRecord("r-lag", "refusal", "bob", "start_vm", None, "denied", {}))
        clock.now = start
        received = {"target": TARGET, "arguments": {"vmid": 100}, "effect": "mutate", "dry_run": False}
        await log.append(AuditRecord("r-open", "received", "alice", "start_vm", "default/qemu/100", None, received))
        await log.append(AuditRecord("r-open", "decision", "alice", "start_vm", "default/qemu/100", "allow", {}))
    finally:
        await log.close()
    monkeypatch.undo()
    res = off(auditlib.archive, store.where, time.time() + 1, store.root / "arch", key=store.key)
    assert res.file is not None and (res.first_seq, res.last_seq) == (1, 3), res  # r-old only
    claimed = off(reconcile.claimed_tasks, store.where, start - reconcile.CLAIM_MARGIN_SECONDS)
    assert upid(2) in claimed, f"the archive took r-near's task claim: {claimed}"
