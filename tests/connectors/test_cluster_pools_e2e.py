"""Cluster and pools end to end (issue #19): SDK client -> HTTPS -> JWT -> real OPA ->
pve_api runtime -> simulator, with the example organisation's policy.

A simulator and gateway of this module's own (pool membership and replication change what
the shared read tests see). Each mutation runs as a human admin and must send exactly the
request its YAML declares; cluster-wide writes are high risk in the default policy (held
for approval), so those are proved unsent and run through the gateway's runtime object.
Proxmox's own refusals (a guest in another pool, a non-empty pool, a disk that cannot
replicate) are sent through the runtime too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.runtimes.base import CallContext
from tests.connectors.test_provision_e2e import admin, call, guests, read, run, text
from tests.support import GatewayThread, free_port

CLUSTER_TOOLS = {
    "pool_get", "pool_create", "pool_update", "pool_members_add", "pool_members_remove", "pool_delete",
    "cluster_options", "replication_job_get", "replication_job_create", "replication_job_update",
    "replication_job_delete", "replication_schedule_now", "replication_job_status", "cluster_next_vmid",
    "cluster_log", "metrics_servers", "metrics_server_get",
}  # fmt: skip
POOLS = "/api2/json/pools"
REPL = "/api2/json/cluster/replication"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("sim-cluster"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(Path(tmp_path_factory.mktemp("gw-cluster")), {"default": sim}, port=free_port())


@pytest.fixture(scope="module")
def gateway(env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(env.config).start()
    yield gw
    gw.stop()


def direct(gw: GatewayThread, name: str, args: dict[str, Any]) -> Any:
    """The connector through the gateway's own runtime object (for Proxmox's refusals)."""
    tool = gw.components.catalog.get(name)
    assert tool is not None and gw.loop is not None
    coro = gw.components.runtime(tool).call(tool, tool.validate(args), CallContext("default"))
    return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(timeout=60).data


READS: list[tuple[str, dict[str, Any], Any]] = [
    ("cluster_options", {}, lambda s: s["console"] == "html5" and s["mac_prefix"] == "BC:24:11"),
    ("cluster_next_vmid", {}, lambda s: s["vmid"] == 104),
    ("cluster_next_vmid", {"vmid": 4242}, lambda s: s["vmid"] == 4242),
    ("cluster_log", {"max": 2}, lambda s: len(s["items"]) == 2 and all("msg" in r for r in s["items"])),
    ("metrics_servers", {}, lambda s: {r["id"] for r in s["items"]} == {"influx_lab", "graphite1"}),
    ("metrics_server_get", {"id": "influx_lab"}, lambda s: s["bucket"] == "proxmox" and "token" not in s),
    ("pool_get", {"poolid": "prod"}, lambda s: {m.get("vmid") for m in s["items"][0]["members"]} >= {100, 101, 200}),
]


@pytest.mark.parametrize(("name", "args", "check"), READS, ids=[f"{r[0]}-{i}" for i, r in enumerate(READS)])
async def test_cluster_reads(gateway: GatewayThread, env: DevEnv, name: str, args: dict[str, Any], check: Any) -> None:
    s = await read(env, name, args)
    assert check(s), s


async def test_next_vmid_refuses_an_id_in_use(gateway: GatewayThread, env: DevEnv) -> None:
    res = await call(env, admin(env), "cluster_next_vmid", {"vmid": 100})
    assert res.is_error and "VM 100 already exists" in text(res)


async def test_pool_lifecycle_and_membership(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    await run(
        gateway,
        env,
        sim,
        "pool_create",
        {"poolid": "ci-pool", "comment": "made by e2e"},
        ("POST", POOLS, {"poolid": "ci-pool", "comment": "made by e2e"}),
    )
    assert "ci-pool" in {p["poolid"] for p in (await read(env, "list_pools", {}))["items"]}
    await run(
        gateway,
        env,
        sim,
        "pool_update",
        {"poolid": "ci-pool", "comment": "renamed"},
        ("PUT", POOLS, {"poolid": "ci-pool", "comment": "renamed"}),
    )
    assert (await read(env, "pool_get", {"poolid": "ci-pool"}))["items"][0]["comment"] == "renamed"

    with pytest.raises(Exception, match="VM 102 belongs already to pool 'lab'"):
        direct(gateway, "pool_members_add", {"poolid": "ci-pool", "vmids": "102"})
    await run(
        gateway,
        env,
        sim,
        "pool_members_add",
        {"poolid": "ci-pool", "vmids": "102", "storages": "ssd", "allow_move": True},
        ("PUT", POOLS, {"poolid": "ci-pool", "vms": "102", "storage": "ssd", "allow-move": "1"}),
    )
    gateway.components.targets.invalidate("default")
    assert (await guests(env))[102]["pool"] == "ci-pool"
    members = (await read(env, "pool_get", {"poolid": "ci-pool"}))["items"][0]["members"]
    assert {m.get("vmid") for m in members if m["type"] == "qemu"} == {102}
    assert {m.get("storage") for m in members if m["type"] == "storage"} == {"ssd"}

    with pytest.raises(Exception, match="pool 'ci-pool' is not empty"):
        direct(gateway, "pool_delete", {"poolid": "ci-pool"})
    await run(
        gateway,
        env,
        sim,
        "pool_members_remove",
        {"poolid": "ci-pool", "vmids": "102", "storages": "ssd"},
        ("PUT", POOLS, {"poolid": "ci-pool", "vms": "102", "storage": "ssd", "delete": "1"}),
    )
    gateway.components.targets.invalidate("default")
    assert (await guests(env))[102].get("pool") is None
    await run(gateway, env, sim, "pool_delete", {"poolid": "ci-pool"}, ("DELETE", POOLS, None))
    res = await call(env, admin(env), "pool_get", {"poolid": "ci-pool"})
    assert res.is_error and "does not exist" in text(res)


async def test_replication_jobs(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    made = await call(
        env,
        admin(env),
        "vm_create",
        {"node": "pve1", "vmid": 150, "name": "repl-src", "disk_storage": "ssd", "disk_gib": 4},
    )
    assert not made.is_error, text(made)
    with pytest.raises(Exception, match="missing replicate feature on volume 'local-lvm:"):
        direct(gateway, "replication_job_create", {"id": "103-0", "target_node": "pve1"})  # on lvm-thin

    await run(
        gateway,
        env,
        sim,
        "replication_job_create",
        {"id": "150-0", "target_node": "pve2", "rep_schedule": "*/30", "comment": "e2e"},
        ("POST", REPL, {"id": "150-0", "target": "pve2", "schedule": "*/30", "comment": "e2e", "type": "local"}),
    )
    job = await read(env, "replication_job_get", {"id": "150-0"})
    assert (job["guest"], job["target"], job["source"], job["schedule"]) == (150, "pve2", "pve1", "*/30")
    assert [j["id"] for j in (await read(env, "list_replication_jobs", {}))["items"]] == ["150-0"]
    await run(
        gateway,
        env,
        sim,
        "replication_job_update",
        {"id": "150-0", "rep_schedule": "*/5", "rate": 50},
        ("PUT", f"{REPL}/150-0", {"schedule": "*/5", "rate": "50"}),
    )
    assert (await read(env, "replication_job_get", {"id": "150-0"}))["rate"] == 50

    await run(
        gateway,
        env,
        sim,
        "replication_schedule_now",
        {"node": "pve1", "id": "150-0"},
        ("POST", "/api2/json/nodes/pve1/replication/150-0/schedule_now", {}),
    )
    for _ in range(100):
        status = await read(env, "replication_job_status", {"node": "pve1", "id": "150-0"})
        if status["last_sync"]:
            break
        await asyncio.sleep(0.1)
    assert status["state"] == "ok" and status["fail_count"] == 0 and status["last_sync"] > 0
    replicas = (await read(env, "list_storage_content", {"node": "pve2", "storage": "ssd", "vmid": 150}))["items"]
    assert [r["volid"] for r in replicas] == ["ssd:vm-150-disk-0"]  # the copy on the target node

    await run(gateway, env, sim, "replication_job_delete", {"id": "150-0"}, ("DELETE", f"{REPL}/150-0", None))
    assert (await read(env, "list_replication_jobs", {}))["items"] == []
    replicas = (await read(env, "list_storage_content", {"node": "pve2", "storage": "ssd", "vmid": 150}))["items"]
    assert replicas == []  # removed with the job (keep was not set)
    res = await call(env, admin(env), "replication_job_get", {"id": "150-0"})
    assert res.is_error and "does not exist" in text(res)
