"""A mutation Proxmox answers at once, without a task, cannot be looked up after a crash:
reconciliation says so (`proxmox: unverifiable`, with the reason) instead of `not_found`, which
reads as "it did not happen". Open calls of a gateway that is gone, settled by `pvegate audit
reconcile` against the simulator: such a tool, and, for contrast, a task tool whose task is not
in the node's list (`not_found` stays right: a task tool that reached Proxmox leaves one)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gateway.store.audit import AuditLog, AuditRecord
from tests.outcomes.helpers import env_for, reconcile_all, reconciled


def _open_call(rid: str, tool: str, target: dict[str, Any], tkey: str) -> list[AuditRecord]:
    """received + decision (allow) of a call whose gateway died before it ended."""
    return [
        AuditRecord(rid, "received", "crash-probe", tool, tkey, None, {"target": target, "effect": "write"}),
        AuditRecord(rid, "decision", "crash-probe", tool, tkey, "allow", {"allow": True}),
    ]


async def test_calls_without_a_task_are_settled_unverifiable_with_the_reason(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim)
    cfg = env.config
    log = AuditLog(cfg.audit_path, head_key=cfg.audit_key_path)
    await log.open()
    try:
        await log.append(*_open_call("sync-1", "firewall_cluster_rule_create", {"cluster": "default"}, "default"))
        guest = {"cluster": "default", "node": "pve1", "type": "qemu", "vmid": 102}
        await log.append(*_open_call("task-1", "vm_start", guest, "default/qemu/102"))
    finally:
        await log.close()
    time.sleep(0.05)  # decided strictly before the pass

    reconcile_all(env)

    def settled(rid: str) -> dict[str, Any]:
        return reconciled(cfg.audit_path, rid)

    sync = settled("sync-1")
    assert sync["proxmox"] == "unverifiable" and sync["synchronous"] is True, sync
    assert "without a task" in sync["reason"] and "cannot be looked up" in sync["reason"], sync
    # a task tool whose task is not in the node's list: it did not reach Proxmox (not a guess)
    task = settled("task-1")
    assert task["proxmox"] == "not_found" and "synchronous" not in task, task
    assert all(r["method"] == "GET" for r in fsim.requests_log())  # looked up, nothing sent
