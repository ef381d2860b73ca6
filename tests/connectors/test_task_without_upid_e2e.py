"""A `task` tool Proxmox answers without a task id: SDK client -> HTTPS -> JWT -> real OPA ->
pve_api runtime -> simulator, on a simulator of this module's own (its faults and moves stay here).

Real PVE's POST /nodes/{node}/vzdump answers `{"data":"OK"}` and starts no task when none of the
selected guests is on that node (PVE/API2/VZDump.pm: "silent exit if specified VMs run on other
nodes"). A backup raced by a migration after the gateway looked up the guest's node is that
answer: nothing was backed up, so the call is `failed`, never `ok`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.runtimes.base import CallContext, ToolError
from tests.support import GatewayThread, audit_rows, free_port


@pytest.fixture(scope="module")
def nsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("nosim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def nenv(nsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("nogw"), {"default": nsim}, port=free_port())


@pytest.fixture(scope="module")
def ngw(nenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(nenv.config).start()
    yield gw
    gw.stop()


def admin(env: DevEnv) -> str:
    return env.token("notask-admin", [], groups=["pve-admins"], kind="human")


async def call(env: DevEnv, name: str, args: dict[str, Any]) -> Any:
    async with mcp_client(env.url, admin(env), env.ca_file) as client:
        return await client.call_tool(name, args)


def text(res: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in res.content)


async def pve(sim: Any, method: str, path: str, data: dict[str, Any] | None = None) -> Any:
    """Proxmox itself (the simulator's API as root's token), not through the gateway."""
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(sim.ca_file)), timeout=10) as http:
        r = await http.request(
            method, f"{sim.api_url}{path}", data=data, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}
        )
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def migrated(sim: Any, vmid: int, source: str, target: str) -> None:
    upid = await pve(sim, "POST", f"/nodes/{source}/qemu/{vmid}/migrate", {"target": target})
    deadline = time.monotonic() + 20
    while (status := await pve(sim, "GET", f"/nodes/{source}/tasks/{upid}/status"))["status"] != "stopped":
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.1)
    assert status["exitstatus"] == "OK", status


async def backups(sim: Any, vmid: int) -> list[str]:
    rows = await pve(sim, "GET", "/nodes/pve1/storage/pbs/content?content=backup")
    return [r["volid"] for r in rows if r.get("vmid") == vmid]


async def vzdump_tasks(sim: Any) -> list[str]:
    return [
        t["upid"]
        for n in ("pve1", "pve2")
        for t in await pve(sim, "GET", f"/nodes/{n}/tasks")
        if t.get("type") == "vzdump"
    ]


async def test_vzdump_for_a_guest_on_another_node_answers_ok_and_starts_no_task(nsim: Any) -> None:
    before = await vzdump_tasks(nsim)
    # guest 103 runs on pve2: pve1 has nothing of it to back up, as PVE: "OK", no task, no archive
    assert await pve(nsim, "POST", "/nodes/pve1/vzdump", {"vmid": "103", "storage": "pbs"}) == "OK"
    assert await pve(nsim, "POST", "/nodes/pve1/vzdump", {"pool": "lab", "storage": "pbs"}) == "OK"  # lab: pve2's
    assert await vzdump_tasks(nsim) == before and await backups(nsim, 103) == []
    upid = await pve(nsim, "POST", "/nodes/pve2/vzdump", {"vmid": "103", "storage": "pbs"})  # its own node: a task
    assert upid.startswith("UPID:pve2:") and ":vzdump:103:" in upid


async def test_backup_raced_by_a_migration_is_failed_not_ok(ngw: GatewayThread, nenv: DevEnv, nsim: Any) -> None:
    """The gateway finds guest 102 on pve2 and sends vzdump there; it migrates to pve1 before
    pve2 handles the request (the simulator holds it), so Proxmox answers "OK" and backs up nothing."""
    assert await backups(nsim, 102) == []
    tasks_before = await vzdump_tasks(nsim)
    nsim.set_faults(latency_ms=4000, latency_path=r"^/nodes/[^/]+/vzdump$")
    try:
        nsim.clear_logs()
        backup = asyncio.create_task(call(nenv, "backup_now", {"vmid": 102, "storage": "pbs"}))
        deadline = time.monotonic() + 30
        while not any(
            e["method"] == "POST" and e["path"].endswith("/nodes/pve2/vzdump")
            for e in await asyncio.to_thread(nsim.requests_log)
        ):
            assert time.monotonic() < deadline and not backup.done(), "backup_now never reached pve2"
            await asyncio.sleep(0.05)
        await migrated(nsim, 102, "pve2", "pve1")  # while pve2 holds the request
        res = await backup
    finally:
        nsim.set_faults(latency_ms=0, latency_path=None)
    sent = [e for e in nsim.requests_log() if e["method"] == "POST" and e["path"].endswith("/vzdump")]
    assert [(e["path"].rsplit("/nodes/", 1)[1], e["status"]) for e in sent] == [("pve2/vzdump", 200)]

    assert res.is_error, text(res)
    assert res.meta["pvegate/outcome"] == "failed", res.meta
    assert text(res) == (
        "backup_now failed: Proxmox started no task: it answered 'OK' instead of a task id "
        "(guest 102 may no longer be on node pve2); nothing was done"
    ), text(res)
    assert not res.structured_content or "task_id" not in res.structured_content

    rows = audit_rows(nenv.config.audit_path, res.meta["pvegate/request_id"])
    assert [r["kind"] for r in rows] == ["received", "decision", "result"], rows
    assert rows[1]["outcome"] == "allow"
    result = rows[-1]
    assert result["outcome"] == "failed", result
    body = json.loads(result["body"])
    assert "started no task: it answered 'OK'" in body["error"] and body["task_id"] is None, body
    assert await backups(nsim, 102) == [] and await vzdump_tasks(nsim) == tasks_before  # nothing was backed up

    # where the guest is now, the same call is a backup
    again = await call(nenv, "backup_now", {"vmid": 102, "storage": "pbs"})
    assert not again.is_error and again.meta["pvegate/outcome"] == "allowed", text(again)
    assert len(await backups(nsim, 102)) == 1


async def test_no_task_for_declares_a_null_answer_the_calls_result(ngw: GatewayThread, nsim: Any) -> None:
    """PVE's POST /lxc/{vmid}/template answers null (pct template's worker goes unnamed): a tool
    that declares `no_task_for: [lxc]` takes that null as its result; the same answer to a tool
    that does not is the failure above."""
    c = ngw.components
    tool = c.catalog.get("guest_convert_to_template")
    assert tool is not None and ngw.loop is not None
    declared = dataclasses.replace(tool, spec={**tool.spec, "no_task_for": ["lxc"]})
    undeclared = dataclasses.replace(tool, spec={k: v for k, v in tool.spec.items() if k != "no_task_for"})

    def run(t: Any, vmid: int) -> Any:
        coro = c.runtime(t).call(t, t.validate({"vmid": vmid}), CallContext("default"))
        return asyncio.run_coroutine_threadsafe(coro, ngw.loop).result(timeout=60)

    out = await asyncio.to_thread(run, declared, 202)  # a stopped container
    assert out.data is None and out.task_id is None and not out.task_running

    stop = await pve(nsim, "POST", "/nodes/pve1/lxc/200/status/stop")
    deadline = time.monotonic() + 20
    while (await pve(nsim, "GET", f"/nodes/pve1/tasks/{stop}/status"))["status"] != "stopped":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    with pytest.raises(ToolError, match=r"^Proxmox started no task: it answered null instead of a task id \(guest 200"):
        await asyncio.to_thread(run, undeclared, 200)
