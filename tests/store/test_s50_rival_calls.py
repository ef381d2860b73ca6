"""Which calls may own a task no record names (reconcile.rival_calls), on both backends.

Reconciliation took the earliest unclaimed task of a call's type for the earliest call without a UPID, so
two calls whose tasks the task list cannot tell apart (two restarts or apt refreshes on one node, two
deletions of one guest's backups) could each be settled from the other's task: a failure recorded as a
success (tests/outcomes/test_s50_task_rivals.py). A task found for a call is now taken only when no other
call may own it: one decided around it whose records name no task and do not say nothing was started (open,
or settled from the task list without a task). This is the read that tells them, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.store.audit import AuditRecord
from gateway.store.reconcile import rival_calls
from tests.store.auditstore import Store


def _rec(rid: str, kind: str, outcome: str | None, **body: Any) -> AuditRecord:
    return AuditRecord(rid, kind, "agent", "node_apt_refresh", "default/pve2", outcome, body)


async def test_rivals_are_the_calls_that_may_own_an_unnamed_task(store: Store) -> None:
    log = store.log()
    await log.open()
    try:
        calls = {
            "me": [],
            "open": [],
            "dry": [_rec("dry", "received", None, dry_run=True)],
            "not-found": [_rec("not-found", "result", "reconciled", proxmox="not_found", task_id=None)],
            "contested": [_rec("contested", "result", "reconciled", proxmox="unverifiable", task_id=None)],
            "dispatched": [_rec("dispatched", "dispatch", None, task_id="UPID:pve2:1:2:3:aptupdate::u@pam!t:")],
            "upstream": [_rec("upstream", "result", "upstream_error")],
            "failed": [_rec("failed", "result", "failed")],
            "refused": [_rec("refused", "refusal", None, sent=False)],
            "read-cut": [_rec("read-cut", "result", "interrupted", pending_reconcile=False)],
            "cut": [_rec("cut", "result", "interrupted", pending_reconcile=True)],
        }
        for rid, after in calls.items():
            await log.append(_rec(rid, "decision", "allow"), *after)
        await log.append(_rec("denied", "decision", "deny"))
    finally:
        await log.close()
    now = time.time()
    found = await asyncio.to_thread(rival_calls, store.where, now - 60, now + 60, "me")
    assert sorted(c.request_id for c in found) == ["contested", "cut", "not-found", "open"]
    assert await asyncio.to_thread(rival_calls, store.where, now + 60, now + 120, "me") == []
