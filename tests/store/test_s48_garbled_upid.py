"""A call whose records hold a task id that is no UPID (the gateway records only whole ones; an older release's
record, or one changed outside it) stayed open on every reconciliation pass: asking Proxmox for its status
failed before any request (the id names no node), the failure read as "unreachable", and the call was left for
the next pass, forever, counted open in health. It is settled now as unverifiable, saying why, with the id
(escaped and cut) for a person to look it up."""

from __future__ import annotations

import json

from gateway.store import audit as auditlib
from gateway.store import reconcile
from gateway.store.audit import AuditRecord, Query
from gateway.store.outcomes import Outcomes
from gateway.store.reconcile import Reconciler
from gateway.tools.catalog import Catalog
from tests.store.auditstore import Store, off

TARGET = {"cluster": "default", "kind": "qemu", "node": "pve1", "vmid": 100}


async def test_a_recorded_task_id_that_is_no_upid_settles_the_call_as_unverifiable(store: Store) -> None:
    garbled = "UPID:pve1:garbled\u202e" + "x" * 500
    log = store.log()
    await log.open()
    try:
        received = {"target": TARGET, "arguments": {"vmid": 100}, "effect": "mutate", "dry_run": False}
        await log.append(
            AuditRecord("r1", "received", "alice", "start_vm", "default/qemu/100", None, received),
            AuditRecord("r1", "decision", "alice", "start_vm", "default/qemu/100", "allow", {}),
            AuditRecord("r1", "dispatch", "alice", "start_vm", "default/qemu/100", None, {"task_id": garbled}),
        )
        calls = off(reconcile.open_calls, store.where, None, None)
        assert [c.task_id for c in calls] == [garbled]
        # the cluster is configured, its client never used: the id names no node to ask
        outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
        rec = Reconciler(None, Catalog({}), outcomes, {"default": object()})  # type: ignore[arg-type, dict-item]
        settled = await rec.settle(calls[0], set())
    finally:
        await log.close()
    assert (settled.action, settled.proxmox) == ("reconciled", "unverifiable"), settled
    assert off(reconcile.open_calls, store.where, None, None) == [], "the call is still open"
    rows = off(auditlib.search, store.where, Query(request_id="r1", kind="result"))
    body = json.loads(rows[-1]["body"])
    assert body["proxmox"] == "unverifiable" and "not a Proxmox task id" in body["reason"], body
    assert "\u202e" not in body["reason"] and len(body["task_id"]) <= 120, body
