"""A composite's check that could not run is never reported as a clean result.

guest_health_summary: `healthy` is null (with `not_checked`) when the Docker, status or snapshot
check failed and no concern was found; false whenever a concern was found; true only when every
check ran. list_backups: a backup storage (or a node's storages) not read makes the answer
`complete: false` with a `reason`, and a guest with none found has count null (unknown), never
0 ("has none"). Each sub-call is answered by hand, as the composite runtime would."""

from __future__ import annotations

import time
from typing import Any

from gateway.tools.runtimes.base import CommandFailed, ToolError
from gateway.tools.runtimes.reducers import guest_health_summary, list_backups

CT = {"vmid": 200, "type": "lxc", "status": "running", "node": "pve1", "name": "app",
      "mem": 10, "maxmem": 100, "disk": 10, "maxdisk": 100, "cpu": 0.01}  # fmt: skip
VM = {"vmid": 100, "type": "qemu", "status": "running", "node": "pve1", "name": "web",
      "mem": 10, "maxmem": 100, "disk": 10, "maxdisk": 100, "cpu": 0.01}  # fmt: skip
LOCAL = {"storage": "local", "node": "pve1", "content": ["backup", "iso"], "active": 1}
NAS = {"storage": "nas", "node": "pve1", "content": ["backup"], "active": 0, "shared": 1}


def backup(vmid: int, hours: float) -> dict[str, Any]:
    return {"volid": f"local:backup/vzdump-{vmid}-{hours}", "vmid": vmid, "ctime": int(time.time() - hours * 3600),
            "content": "backup"}  # fmt: skip


def fake(answers: dict[str, Any], warnings: list[str]) -> Any:
    """`sub` as the composite runtime hands it over: a leaf's own warnings land in `warnings`, prefixed."""

    async def sub(name: str, args: dict[str, Any]) -> Any:
        value = answers[name]
        if isinstance(value, Exception):
            raise value
        if isinstance(value, tuple):  # (data, the leaf's warnings)
            value, leaf_warnings = value
            warnings.extend(f"{name}: {w}" for w in leaf_warnings)
        return value

    return sub


def health_answers(**over: Any) -> dict[str, Any]:
    answers: dict[str, Any] = {
        "list_guests": [CT, VM],
        "get_guest_status": {"status": "running", "mem": 10, "maxmem": 100, "disk": 10, "maxdisk": 100, "cpu": 0.01},
        "list_snapshots": [],
        "list_storage": [LOCAL],
        "list_storage_content": [backup(200, 3), backup(100, 3)],
        "lxc_docker_ps": [{"ID": "abc", "Names": "web-1", "State": "running", "Status": "Up 2 hours"}],
    }
    answers.update(over)
    return answers


async def health(vmid: int = 200, **over: Any) -> dict[str, Any]:
    warnings: list[str] = []
    out = await guest_health_summary(fake(health_answers(**over), warnings), {"vmid": vmid}, warnings)
    out["warnings"] = warnings
    return out


async def test_health_true_only_when_every_check_ran() -> None:
    out = await health()
    assert (out["healthy"], out["concerns"], out["not_checked"]) == (True, [], [])
    # Docker not installed (exit 127) is an answer, not a failed check
    out = await health(lxc_docker_ps=CommandFailed("docker: not found", 127))
    assert (out["healthy"], out["not_checked"]) == (True, [])


async def test_health_unknown_when_docker_could_not_be_asked() -> None:
    # the reviewer's case: docker ps hung on the node, and the answer was healthy: true
    out = await health(lxc_docker_ps=ToolError("command on node pve1 timed out after 10s"))
    assert out["healthy"] is None, out
    assert out["concerns"] == [] and out["docker"] is None
    assert out["not_checked"] == ["docker: docker ps: command on node pve1 timed out after 10s"]
    assert any("not reported healthy" in w for w in out["warnings"])


async def test_health_unknown_when_status_or_snapshots_failed() -> None:
    out = await health(get_guest_status=ToolError("Proxmox answered 500: boom"))
    assert out["healthy"] is None and out["not_checked"] == ["status: Proxmox answered 500: boom"]
    out = await health(vmid=100, list_snapshots=ToolError("Proxmox answered 500: boom"))
    assert out["healthy"] is None and out["not_checked"] == ["snapshots: Proxmox answered 500: boom"]


async def test_health_false_when_a_concern_was_found_even_with_a_check_failed() -> None:
    ps = [{"ID": "abc", "Names": "worker-1", "State": "exited", "Status": "Exited (1) 2 hours ago"}]
    out = await health(list_snapshots=ToolError("boom"), lxc_docker_ps=ps)
    assert out["healthy"] is False and out["concerns"] == ["docker container worker-1 is exited"]
    assert out["not_checked"] == ["snapshots: boom"]


def backup_answers(**over: Any) -> dict[str, Any]:
    answers: dict[str, Any] = {
        "list_storage": [LOCAL],
        "list_storage_content": [backup(100, 20)],
        "list_guests": [VM, {**CT, "vmid": 101, "type": "qemu"}],
    }
    answers.update(over)
    return answers


async def backups(**over: Any) -> dict[str, Any]:
    warnings: list[str] = []
    return await list_backups(fake(backup_answers(**over), warnings), {}, warnings)


def per_guest(out: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(p["vmid"], p["count"], p["newest_age_hours"]) for p in out["per_guest"]]


async def test_backups_complete_says_has_none() -> None:
    out = await backups()
    assert (out["complete"], out["reason"]) == (True, None)
    assert per_guest(out) == [(100, 1, 20.0), (101, 0, None)]


async def test_backups_storage_failed_is_unknown_not_none() -> None:
    # the reviewer's case: every backup storage answered 500, and every guest was reported without backups
    out = await backups(list_storage_content=ToolError("Proxmox answered 500: simulated internal error"))
    assert out["complete"] is False
    assert out["reason"] == (
        "not every backup storage was read: storage local on pve1: Proxmox answered 500: simulated internal error"
    )
    assert per_guest(out) == [(100, None, None), (101, None, None)]


async def test_backups_inactive_storage_or_offline_node_is_unknown_for_guests_without_any() -> None:
    out = await backups(list_storage=[LOCAL, NAS])
    assert out["complete"] is False and "storage nas on pve1 is not active" in out["reason"]
    # a backup found stands (its newest may be newer, on what was not read); none found is unknown
    assert per_guest(out) == [(100, 1, 20.0), (101, None, None)]
    out = await backups(list_storage=([LOCAL], ["node pve3 is offline: its entries are missing"]))
    assert out["complete"] is False and "node pve3 is offline" in out["reason"]
    assert per_guest(out) == [(100, 1, 20.0), (101, None, None)]
