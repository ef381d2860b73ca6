"""A call whose UPID was never recorded is matched to a task in the node's task list only by what
makes the task its own: a task of the tool's declared type (`task_type`), started by the gateway's
token itself (Proxmox's `userfilter` is a substring match: `root@pam!pvegate` also returns
`root@pam!pvegate-backup`'s tasks), on its guest, around its decision with some tolerance for the
gateway's clock running ahead of the node's. A tool Proxmox answers without a task is never searched
for. Open calls of a gateway that is gone, settled by `pvegate audit reconcile` against the
simulator; the simulator's task list is the witness of what ran, and under which token."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from gateway.sim.scenario import scenario_path
from gateway.store.audit import AuditLog, AuditRecord
from tests.outcomes.helpers import env_for, reconcile_all, reconciled, task_stopped

GUEST = {"cluster": "default", "node": "pve2", "type": "qemu", "vmid": 102}
GUEST_KEY = "default/qemu/102"


def _open_call(rid: str, tool: str, target: dict[str, Any], tkey: str) -> list[AuditRecord]:
    """received + decision (allow) of a call whose gateway died before it recorded Proxmox's answer."""
    return [
        AuditRecord(rid, "received", "crash-probe", tool, tkey, None, {"target": target, "effect": "write"}),
        AuditRecord(rid, "decision", "crash-probe", tool, tkey, "allow", {"allow": True}),
    ]


async def _write_open_calls(env: Any, *calls: tuple[str, str]) -> None:
    cfg = env.config
    log = AuditLog(cfg.audit_path, head_key=cfg.audit_key_path)
    await log.open()
    try:
        for rid, tool in calls:
            await log.append(*_open_call(rid, tool, GUEST, GUEST_KEY))
    finally:
        await log.close()


async def _start_guest(sim: Any, token: str) -> dict[str, Any]:
    """POST start of VM 102 as `token` (as anything holding that token would), and its finished task."""
    r = httpx.post(
        sim.api_url.rstrip("/") + "/nodes/pve2/qemu/102/status/start",
        headers={"Authorization": "PVEAPIToken=" + token},
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
    )
    assert r.status_code == 200, r.text[:300]
    upid = r.json()["data"]
    return await task_stopped(sim, str(upid))


async def test_a_task_is_taken_only_by_a_call_of_a_tool_of_its_type(fsim: Any, tmp_path: Path) -> None:
    """Oldest first: a synchronous call (tags), a vm_stop and a vm_start on VM 102, none with a UPID; then
    the gateway's token starts VM 102 (a qmstart task). Only the vm_start is matched to it."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    await _write_open_calls(
        env,
        ("sync-1", "guest_tags_set"),
        ("stop-1", "vm_stop"),
        ("start-1", "vm_start"),
        ("gone-1", "vm_start_renamed_since"),  # a tool this catalog no longer has
    )
    time.sleep(0.05)  # decided strictly before the task and the pass
    task = await _start_guest(fsim, fsim.tokens["admin"])  # the gateway's own token (root@pam!pvegate)
    assert task["type"] == "qmstart" and task["upid"].split(":")[7] == "root@pam!pvegate", task
    searched_before = len([r for r in fsim.requests_log() if r["path"].endswith("/tasks")])
    reconcile_all(env)

    sync = reconciled(env.config.audit_path, "sync-1")
    assert sync["proxmox"] == "unverifiable" and sync["synchronous"] is True and sync["task_id"] is None, sync
    assert "without a task" in sync["reason"], sync
    stop = reconciled(env.config.audit_path, "stop-1")
    assert stop["proxmox"] == "not_found" and stop["task_id"] is None, stop
    start = reconciled(env.config.audit_path, "start-1")
    assert start["proxmox"] == "ok" and start["task_id"] == task["upid"] and start["found_by"] == "task_list", start
    gone = reconciled(env.config.audit_path, "gone-1")
    assert gone["proxmox"] == "unverifiable" and "not in this catalog" in gone["reason"], gone
    # the task lists read: one type each, only those of the tools searched for (none for the tags call)
    lists = [r for r in fsim.requests_log() if r["path"].endswith("/tasks")][searched_before:]
    asked = sorted(parse_qs(r["query"])["typefilter"][0] for r in lists)
    assert asked == ["hastart", "hastop", "qmstart", "qmstop"], asked


@pytest.fixture
def two_token_sim(tmp_path: Path) -> Iterator[Any]:
    """The small scenario plus a second token whose id extends the gateway's (root@pam!pvegate-backup)."""
    from gateway.sim.harness import start_simulator

    text = scenario_path("small").read_text()
    admin = '  - {name: admin, tokenid: "root@pam!pvegate", privsep: false}\n'
    assert admin in text
    text = text.replace(admin, admin + '  - {name: backup, tokenid: "root@pam!pvegate-backup", privsep: false}\n')
    scenario = tmp_path / "small_two_tokens.yaml"
    scenario.write_text(text)
    handle = start_simulator(scenario, tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()


async def test_another_tokens_task_is_never_the_gateways(two_token_sim: Any, tmp_path: Path) -> None:
    """The gateway's vm_start never reached Proxmox; a backup system then starts the guest with its own
    token, whose id `root@pam!pvegate` is a prefix of. Not the gateway's task: not_found."""
    sim = two_token_sim
    env = env_for(tmp_path, sim)
    sim.set_faults(task_seconds=0.1)
    await _write_open_calls(env, ("start-1", "vm_start"))
    time.sleep(0.05)
    other = await _start_guest(sim, sim.tokens["backup"])
    assert other["upid"].split(":")[7] == "root@pam!pvegate-backup", other
    reconcile_all(env)
    body = reconciled(env.config.audit_path, "start-1")
    assert body["proxmox"] == "not_found" and body["task_id"] is None, body


async def test_a_task_that_started_before_the_decision_time_is_found(fsim: Any, tmp_path: Path) -> None:
    """The gateway's clock ran 3 s ahead of the node's: its decision time is 3 s after the node's start
    time of the task the call started (modelled by deciding 3 s after the task started). Found, ok."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    task = await _start_guest(fsim, fsim.tokens["admin"])
    time.sleep(3.2)
    await _write_open_calls(env, ("start-1", "vm_start"))
    time.sleep(0.05)
    reconcile_all(env)
    body = reconciled(env.config.audit_path, "start-1")
    assert body["proxmox"] == "ok" and body["task_id"] == task["upid"], body
