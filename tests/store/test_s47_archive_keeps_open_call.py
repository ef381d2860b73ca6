"""`audit archive` stops before an open call (an allowed decision with no settling record) so reconciliation
can still settle it; it must keep the whole call, not only its decision. Its `received` record comes before
the decision and is where reconciliation reads the call's target (cluster, node, vmid), arguments, effect and
dry run: archived away, the task search runs without the guest's vmid and takes any task of the tool's type
by the gateway's token in the window (another call's) for this one."""

from __future__ import annotations

import time

import pytest

from gateway.store import audit as auditlib
from gateway.store import reconcile
from tests.store.auditstore import OPEN_TARGET, AuditClock, Store, off, write_open_call, write_settled


async def test_archive_keeps_the_received_record_of_an_open_call(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = AuditClock.install(monkeypatch)
    now = clock.now
    log = store.log()
    await log.open()
    try:
        # a settled call first, so there is something to archive (two hours before: past the task claims'
        # margin the archive also keeps, test_s48_archive_keeps_task_claims.py)
        clock.now = now - 7200
        await write_settled(log, "r0", 101)
        clock.now = now
        await write_open_call(log, "r1")
    finally:
        await log.close()
        monkeypatch.undo()
    res = off(auditlib.archive, store.where, time.time() + 1, store.root / "arch", key=store.key)
    assert res.file is not None and res.last_seq == 3, res  # r0 only
    calls = off(reconcile.open_calls, store.where, None, None)
    assert [c.request_id for c in calls] == ["r1"]
    call = calls[0]
    assert call.target == OPEN_TARGET, f"the open call lost its target to the archive: {call.target}"
    assert call.effect == "mutate"
    assert off(auditlib.verify, store.where, key=store.key).ok
