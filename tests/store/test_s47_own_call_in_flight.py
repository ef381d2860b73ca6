"""A mutation whose task outlives the wait is put in `outcomes.unsettled` (its `running` result follows) while
its call is still in flight: the result is being written, the pool hold ended, the answer returned. A periodic
pass over this process's own calls that runs in that moment finds it `in_flight` (this process still runs it)
and must leave it in `unsettled`: dropped from it, the task's end is never recorded until the next restart, and
health counts one open call too few."""

from __future__ import annotations

import time

from gateway.store.audit import AuditRecord
from gateway.store.outcomes import Outcomes
from gateway.store.reconcile import Reconciler
from tests.store.auditstore import Store


async def test_an_own_call_still_in_flight_stays_unsettled(store: Store) -> None:
    log = store.log()
    await log.open()
    try:
        outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
        rec = Reconciler(None, None, outcomes, {})  # type: ignore[arg-type]
        start = time.time()
        target = "default/qemu/100"
        await log.append(
            AuditRecord("r1", "received", "alice", "start_vm", target, None, {"effect": "mutate"}),
            AuditRecord("r1", "decision", "alice", "start_vm", target, "allow", {}),
        )
        with outcomes.flight("r1"):  # the pipeline's call: its task outlived the wait
            outcomes.unsettled.add("r1")
            running = {"task_id": None, "pending_reconcile": True}
            await log.append(AuditRecord("r1", "result", "alice", "start_vm", target, "running", running))
            settled = await rec.settle_own(start - 1)  # the periodic pass, in that moment
            assert settled is not None and [(s.request_id, s.action) for s in settled] == [("r1", "in_flight")]
        assert "r1" in outcomes.unsettled, "the call's task outcome would never be recorded by this process"
    finally:
        await log.close()
