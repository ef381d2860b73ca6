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
from tests.store.auditstore import AuditClock, Store, off, write_open_call, write_settled


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
        clock.now = start - 3 * 3600  # long before the open call: archived
        await write_settled(log, "r-old", 101, upid(1))
        clock.now = start - 1800  # half an hour before it: its task claim is read when it is reconciled
        await write_settled(log, "r-near", 102, upid(2))
        clock.now = start
        await write_open_call(log, "r-open")
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
        await write_settled(log, "r-old", 101)
        clock.now = start - 1200  # a claim twenty minutes before the open call
        await write_settled(log, "r-near", 102, upid(2))
        clock.now = start - 3900  # then a refusal by a replica whose clock lags 45 minutes
        await log.append(AuditRecord("r-lag", "refusal", "bob", "start_vm", None, "denied", {}))
        clock.now = start
        await write_open_call(log, "r-open")
    finally:
        await log.close()
    monkeypatch.undo()
    res = off(auditlib.archive, store.where, time.time() + 1, store.root / "arch", key=store.key)
    assert res.file is not None and (res.first_seq, res.last_seq) == (1, 3), res  # r-old only
    claimed = off(reconcile.claimed_tasks, store.where, start - reconcile.CLAIM_MARGIN_SECONDS)
    assert upid(2) in claimed, f"the archive took r-near's task claim: {claimed}"
