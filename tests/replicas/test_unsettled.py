"""The replica tests' "nothing lost" check (harness.unsettled) counts a call as settled exactly when
reconciliation does: a result that still waits on reconciliation leaves it open. On a SQLite audit
(the same SQL as PostgreSQL's), so it runs without the package's cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.store.audit import AuditLog, AuditRecord
from tests.replicas.harness import unsettled


def _call(rid: str, *after: tuple[str, str, dict[str, Any]]) -> list[AuditRecord]:
    """An allowed vm_start, then the records `after` it (kind, outcome, body)."""
    recs = [
        AuditRecord(rid, "received", "agent", "vm_start", "default/qemu/102", None, {"effect": "write"}),
        AuditRecord(rid, "decision", "agent", "vm_start", "default/qemu/102", "allow", {"allow": True}),
    ]
    return recs + [AuditRecord(rid, kind, "agent", "vm_start", "default/qemu/102", out, b) for kind, out, b in after]


async def test_only_what_settles_a_call_for_reconciliation_settles_it_here(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    log = AuditLog(path)
    await log.open()
    try:
        upid = "UPID:pve2:000F6AAE:0A1B2C3D:65000000:qmstart:102:root@pam!pvegate:"
        await log.append(
            *_call("cut", ("result", "interrupted", {"task_id": upid, "pending_reconcile": True})),
            *_call("running", ("result", "running", {"task_id": upid, "pending_reconcile": True})),
            *_call("no-result"),
            *_call("read-cut", ("result", "interrupted", {"pending_reconcile": False})),
            *_call("done", ("result", "ok", {})),
            *_call("reconciled", ("result", "interrupted", {"pending_reconcile": True}), ("result", "reconciled", {})),
            *_call("refused", ("refusal", "refused", {"sent": False})),
        )
    finally:
        await log.close()
    assert unsettled(path) == ["cut", "no-result", "running"]
