"""A lost answer is never settled from a task the task list cannot tell from another lost call's.

A call whose UPID was never recorded (a crash, a cut connection) is looked for in its node's task list by
type, token, worker id and time. Some tasks carry no worker id that tells two calls apart: an apt refresh
(`aptupdate`) and an SDN apply have none, a service restart and a URL download carry the service or file
name, which the search does not check, and two deletions of one guest's backups share `103@local`. With two
such calls on one node both unrecorded, reconciliation gave the earliest task to the earliest call: when the
second call's request reached Proxmox first (concurrent calls), each got the other's outcome, a failed
restart recorded `ok`, a succeeded one `failed`; when only one of them reached Proxmox, the one that never did
took its task (`ok`) and the one that did was `not_found`. Now a task another such call could as well own is
taken by neither: both are `reconciled` with `proxmox: unverifiable`, naming the task and the other call.

`pvegate audit reconcile` against the simulator, whose task list is the witness of what ran."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gateway.store.audit import AuditLog, AuditRecord
from tests.outcomes.helpers import env_for, reconcile_all, reconciled, task_stopped

NODE = {"cluster": "default", "node": "pve2"}


async def _write_open_calls(env: Any, calls: list[tuple[str, str, dict[str, Any], dict[str, Any]]]) -> None:
    """received + decision (allow) of calls whose gateway died before it recorded Proxmox's answer:
    (request id, tool, target, arguments), decided in this order."""
    log = AuditLog(env.config.audit_path, head_key=env.config.audit_key_path)
    await log.open()
    try:
        for rid, tool, target, args in calls:
            body = {"target": target, "arguments": args, "effect": "write"}
            await log.append(
                AuditRecord(rid, "received", "crash-probe", tool, "default/pve2", None, body),
                AuditRecord(rid, "decision", "crash-probe", tool, "default/pve2", "allow", {"allow": True}),
            )
    finally:
        await log.close()


async def _send(sim: Any, method: str, path: str) -> dict[str, Any]:
    """The request as the gateway's token (as the gateway that died sent it), and its finished task."""
    with httpx.Client(
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
        headers={"Authorization": "PVEAPIToken=" + sim.tokens["admin"]},
    ) as c:
        r = c.request(method, sim.api_url.rstrip("/") + path)
    assert r.status_code == 200, r.text[:300]
    upid = str(r.json()["data"])
    return await task_stopped(sim, upid)


def _contested(env: Any, rid: str, other: str, upid: str | None = None) -> None:
    got = reconciled(env.config.audit_path, rid)
    assert (got["proxmox"], got["task_id"]) == ("unverifiable", None), (rid, got)
    assert got["rivals"] == [other] and other in got["reason"], (rid, got)
    if upid is not None:
        assert got["candidate"] == upid, (rid, got)


async def test_two_service_restarts_never_get_each_others_outcome(fsim: Any, tmp_path: Path) -> None:
    """Oldest first: a restart of pveproxy, then one of systemd-timesyncd (not installed: its task fails),
    neither with a UPID; the second one's request reached Proxmox first. The old code recorded the pveproxy
    restart `failed` and the failed one `ok`."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    await _write_open_calls(
        env,
        [
            ("restart-proxy", "node_service_restart", NODE, {"node": "pve2", "service": "pveproxy"}),
            ("restart-ntp", "node_service_restart", NODE, {"node": "pve2", "service": "systemd-timesyncd"}),
        ],
    )
    time.sleep(0.05)
    failed = await _send(fsim, "POST", "/nodes/pve2/services/systemd-timesyncd/restart")
    time.sleep(1.1)  # a later start time (whole seconds): the failed task is the earliest on the node
    ok = await _send(fsim, "POST", "/nodes/pve2/services/pveproxy/restart")
    assert failed["exitstatus"] != "OK" and ok["exitstatus"] == "OK", (failed, ok)
    reconcile_all(env)
    for rid, other in (("restart-proxy", "restart-ntp"), ("restart-ntp", "restart-proxy")):
        got = reconciled(env.config.audit_path, rid)
        assert got["proxmox"] != "ok" or rid != "restart-ntp", got  # never the failed restart recorded ok
        _contested(env, rid, other)


async def test_a_task_only_one_of_two_calls_started_is_taken_by_neither(fsim: Any, tmp_path: Path) -> None:
    """Two apt refreshes of one node (their tasks have no worker id), neither with a UPID; only the second
    one's request reached Proxmox. The old code settled the first `ok` from the second's task and the
    second, which ran, `not_found`."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    await _write_open_calls(
        env,
        [
            ("apt-1", "node_apt_refresh", NODE, {"node": "pve2"}),
            ("apt-2", "node_apt_refresh", NODE, {"node": "pve2"}),
        ],
    )
    time.sleep(0.05)
    task = await _send(fsim, "POST", "/nodes/pve2/apt/update")
    assert task["id"] == "", task
    reconcile_all(env)
    _contested(env, "apt-1", "apt-2", task["upid"])
    _contested(env, "apt-2", "apt-1", task["upid"])


async def test_two_deletions_of_one_guests_backups_are_not_swapped(fsim: Any, tmp_path: Path) -> None:
    """Two deletions of guest 103's backups (both tasks `103@local`), neither with a UPID; the second one's
    task started first. The old code gave each the other's task."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    with httpx.Client(
        verify=ssl.create_default_context(cafile=str(fsim.ca_file)),
        headers={"Authorization": "PVEAPIToken=" + fsim.tokens["admin"]},
    ) as c:
        r = c.get(fsim.api_url.rstrip("/") + "/nodes/pve2/storage/local/content", params={"content": "backup"})
    first, second = sorted(str(v["volid"]) for v in r.json()["data"] if v.get("vmid") == 103)[:2]
    owner = {"cluster": "default", "content": "backup", "vmid": 103, "node": None, "pool": None,
             "pool_known": True, "tags": [], "exists": None}  # fmt: skip
    calls = []
    for rid, volume in (("del-1", first), ("del-2", second)):
        target = {**NODE, "storage": "local", "volume_of": {**owner, "volume": volume}}
        calls.append((rid, "storage_volume_delete", target, {"node": "pve2", "storage": "local", "volume": volume}))
    await _write_open_calls(env, calls)
    time.sleep(0.05)
    of_second = await _send(fsim, "DELETE", f"/nodes/pve2/storage/local/content/{quote(second, safe='')}")
    time.sleep(1.1)
    of_first = await _send(fsim, "DELETE", f"/nodes/pve2/storage/local/content/{quote(first, safe='')}")
    assert of_second["id"] == of_first["id"] == "103@local"
    reconcile_all(env)
    _contested(env, "del-1", "del-2", of_second["upid"])
    _contested(env, "del-2", "del-1")
