"""node_upgrade_preflight: read-only checks before upgrading a node, from other read tools.

`ready` is true only when every check ran and none found a blocker: a check that could
not run is reported with its reason and makes the answer not ready (never a silent pass).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from gateway.tools.runtimes.base import ToolError

Sub = Callable[[str, dict[str, Any]], Awaitable[Any]]

MIN_ROOT_FREE = 2 << 30  # apt needs room to unpack a kernel and pve-manager
KERNEL_PREFIXES = ("proxmox-kernel-", "pve-kernel-")


def _rows(data: Any) -> list[dict[str, Any]]:
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]
    return [r for r in data or [] if isinstance(r, dict)]


def _shaped(res: Any, kind: type, what: str) -> Any:
    """`res` when it is an error or a `kind` (a list: also a fan-out's {"items": [...]}), otherwise
    a ToolError: an answer of another shape (a string, an object for a list) is a check that could
    not run, never read as "none pending" or "no guests running"."""
    if isinstance(res, BaseException) or (res is None and kind is list):  # null: Proxmox's empty list
        return res
    inner = res.get("items") if kind is list and isinstance(res, dict) else res
    if isinstance(inner, kind):
        return res
    return ToolError(f"Proxmox answered {what} with {type(res).__name__}, not a {kind.__name__}")


def _why(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ToolError) else type(exc).__name__


async def upgrade_preflight(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    node = str(args["node"])
    updates, repos, status, guests = await asyncio.gather(
        sub("node_apt_updates", {"node": node}),
        sub("node_apt_repositories", {"node": node}),
        sub("get_node_status", {"node": node}),
        sub("list_guests", {"node": node}),
        return_exceptions=True,
    )
    updates = _shaped(updates, list, "the pending updates")
    repos = _shaped(repos, dict, "the repositories")
    status = _shaped(status, dict, "the node status")
    guests = _shaped(guests, list, "the guest list")
    checks: list[dict[str, Any]] = []
    blockers: list[str] = []

    def check(name: str, res: Any, ok: bool, detail: str) -> None:
        if isinstance(res, BaseException):
            checks.append({"check": name, "ran": False, "ok": None, "detail": _why(res)})
            blockers.append(f"{name} could not be checked: {_why(res)}")
            warnings.append(f"{name}: {_why(res)}")
            return
        checks.append({"check": name, "ran": True, "ok": ok, "detail": detail})
        if not ok:
            blockers.append(detail)

    pending = [] if isinstance(updates, BaseException) else _rows(updates)
    kernel = sorted(str(u.get("Package")) for u in pending if str(u.get("Package", "")).startswith(KERNEL_PREFIXES))
    check("updates", updates, True, f"{len(pending)} package updates pending")

    repo_errors = [] if isinstance(repos, BaseException) else list(repos.get("errors") or [])
    check(
        "repositories",
        repos,
        not repo_errors,
        "repository files parse cleanly"
        if not repo_errors
        else "; ".join(f"{e.get('path')}: {e.get('error')}" for e in repo_errors if isinstance(e, dict)),
    )

    root = {} if isinstance(status, BaseException) else status.get("rootfs") or {}
    free = root.get("available") if isinstance(root, dict) else None
    if not isinstance(status, BaseException) and not isinstance(free, int | float):
        status = ToolError("the node status has no root filesystem figures")
    check(
        "root_filesystem",
        status,
        isinstance(free, int | float) and free >= MIN_ROOT_FREE,
        f"{(free or 0) / (1 << 30):.1f} GiB free on / (at least {MIN_ROOT_FREE >> 30} GiB wanted)",
    )

    rows = [] if isinstance(guests, BaseException) else _rows(guests)
    running = [r for r in rows if r.get("status") == "running" and r.get("node", node) == node]
    ha = [r for r in running if r.get("hastate")]
    check("guests", guests, True, f"{len(running)} running guests ({len(ha)} HA-managed) on {node}")

    return {
        "node": node,
        "ready": not blockers,
        "blockers": blockers,
        "updates": len(pending),
        "kernel_updates": kernel,
        "reboot_required": bool(kernel),
        "running_guests": [{"vmid": r.get("vmid"), "name": r.get("name"), "type": r.get("type")} for r in running],
        "ha_managed_guests": [r.get("vmid") for r in ha],
        "checks": checks,
        "collected_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
