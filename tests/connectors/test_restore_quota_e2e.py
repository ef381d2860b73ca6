"""Restores are held to the resource quotas at the size their backup records: SDK client ->
HTTPS -> JWT -> real OPA -> gateway -> simulator.

A restore creates a guest (or, in place, replaces one) with the configuration stored in the
backup. The gateway reads that configuration (GET /nodes/{node}/vzdump/extractconfig) and
counts it as a create counts its arguments: a VM's cores times its sockets, a container's
memory plus its swap, every disk. The policy is the repository's library and example data
with a pool-scoped agent added: `lab-restorer` agents hold pool_operator on pool lab, whose
quota (`lab-restorers`) caps a restored guest at 4 cores, 8 GiB and 100 GiB of disk and the
pool at 14 cores; `lab-restore-in-place` caps what a restore in place leaves in lab.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.connectors.test_backup_e2e import backups_of
from tests.connectors.test_provision_e2e import admin, call, guests, text
from tests.support import GatewayThread, example_env, mutations
from tests.support import resource_facts as facts

LAB_RESTORERS = {
    "name": "lab-restorers",
    "roles": ["pool_operator"],
    "pools": ["lab"],
    "max_per_guest": {"cores": 4, "memory_mib": 8192, "disk_gib": 100},
    "max_pool_total": {"cores": 14},
}
IN_PLACE = {"name": "lab-restore-in-place", "tools": ["*_restore_in_place"], "pools": ["lab"],
            "max_per_guest": {"disk_gib": 100}}  # fmt: skip


@pytest.fixture(scope="module")
def rsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("rsim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def renv(rsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    def edit(data: dict[str, Any]) -> None:
        data["bindings"].append(
            {"name": "lab-restorers", "role": "pool_operator", "token_roles": ["lab-restorer"],
             "principal_kinds": ["agent"], "scope": {"pools": ["lab"]}}
        )  # fmt: skip
        data["resource_quotas"] += [LAB_RESTORERS, IN_PLACE]

    return example_env(tmp_path_factory.mktemp("restore"), rsim, edit)


@pytest.fixture(scope="module")
def rgw(renv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(renv.config).start()
    yield gw
    gw.stop()


def restorer(env: DevEnv) -> str:
    return env.token("lab-restore-agent", ["lab-restorer"], kind="agent")


async def ok(env: DevEnv, name: str, args: dict[str, Any]) -> Any:
    res = await call(env, admin(env), name, args)
    assert not res.is_error, f"{name}: {text(res)}"
    return res


async def test_restores_count_the_backups_size(rgw: GatewayThread, renv: DevEnv, rsim: Any) -> None:
    env, sim = renv, rsim
    # a big VM in lab (3 cores on each of 2 sockets, two disks: 120 GiB) and its backup; a
    # backup of lab's container 202 (1 core, 512 MiB + 512 MiB swap, 8 GiB)
    await ok(env, "vm_create", {"node": "pve1", "vmid": 170, "name": "big", "cores": 3, "sockets": 2, "memory": 4096,
                                "disk_storage": "local-lvm", "disk_gib": 20, "pool": "lab"})  # fmt: skip
    await ok(env, "vm_disk_attach", {"vmid": 170, "index": 1, "storage": "local-lvm", "disk_gib": 100})
    await ok(env, "backup_now", {"vmid": 170, "storage": "pbs"})  # shared: readable on every node
    await ok(env, "backup_now", {"vmid": 202, "storage": "pbs"})
    big = (await backups_of(env, "pve1", "pbs", 170))[0]
    ct = (await backups_of(env, "pve1", "pbs", 202))[0]
    small = (await backups_of(env, "pve2", "local", 103))[0]  # dev-scratch: 1 core, 1 GiB, 16 GiB

    # the facts: what the backup holds, counted as a create counts it
    big_new = {"node": "pve1", "vmid": 175, "archive": big, "pool": "lab"}
    f = facts(rgw, "vm_restore", big_new)
    assert f["requested"] == {"guests": 1, "cores": 6, "memory_mib": 4096, "disk_gib": 120}, f
    assert f["pool"] == "lab" and f["pool_usage"] is not None and "final" not in f
    ct_new = {"node": "pve1", "vmid": 178, "archive": ct, "storage": "local-lvm", "pool": "lab"}
    f = facts(rgw, "lxc_restore", ct_new)
    assert f["requested"] == {"guests": 1, "cores": 1, "memory_mib": 1024, "disk_gib": 8}, f
    # over an existing guest: it ends up with the backup's size; the pool gains the growth
    f = facts(rgw, "vm_restore_in_place", {"vmid": 103, "archive": big})
    assert f["final"] == {"cores": 6, "memory_mib": 4096, "disk_gib": 120}, f
    assert f["requested"] == {"guests": 0, "cores": 5, "memory_mib": 3072, "disk_gib": 104}, f
    assert f["pool"] == "lab"
    f = facts(rgw, "vm_restore_in_place", {"vmid": 103, "archive": small})  # its own backup: no growth
    assert f["final"] == {"cores": 1, "memory_mib": 1024, "disk_gib": 16}, f
    assert set(f["requested"].values()) == {0}, f

    # the pool-scoped agent may restore lab's guests into lab, but not a 6-core, 120 GiB one
    tok = restorer(env)
    sim.clear_logs()
    res = await call(env, tok, "vm_restore", big_new)
    assert res.is_error and "quota.resource_per_guest" in res.structured_content["codes"], text(res)
    assert "lab-restorers" in text(res) and "asks for 6 cores" in text(res), text(res)
    assert "asks for 120 GiB of disk" in text(res), text(res)
    assert mutations(sim) == []

    # a backup whose configuration cannot be read cannot be counted: refused, nothing sent
    sim.set_faults(error_rate=1.0, error_path="/vzdump/extractconfig")
    try:
        assert facts(rgw, "lxc_restore", ct_new)["final"] is None
        res = await call(env, tok, "lxc_restore", ct_new)
    finally:
        sim.set_faults(error_rate=0.0, error_path=None)
    assert res.is_error and res.structured_content["codes"] == ["quota.resource_facts_missing"], text(res)
    assert mutations(sim) == []

    # within the quota: sent as declared, the restored guests in lab (lab: 12 cores, then 13, 14)
    res = await call(env, tok, "lxc_restore", ct_new)
    assert not res.is_error, text(res)
    res = await call(env, tok, "vm_restore", {"node": "pve2", "vmid": 176, "archive": small, "pool": "lab"})
    assert not res.is_error, text(res)
    assert mutations(sim) == [("POST", "/api2/json/nodes/pve1/lxc"), ("POST", "/api2/json/nodes/pve2/qemu")]
    now = await guests(env)
    assert (now[178]["pool"], now[178]["maxcpu"], now[176]["pool"], now[176]["maxcpu"]) == ("lab", 1, "lab", 1)

    # the pool is full: one more 1-core restore is over lab's 14 cores
    sim.clear_logs()
    res = await call(env, tok, "vm_restore", {"node": "pve2", "vmid": 177, "archive": small, "pool": "lab"})
    assert res.is_error and "quota.resource_pool_total" in res.structured_content["codes"], text(res)
    assert "pool lab holds 14 cores and the call adds 1, over its limit of 14" in text(res), text(res)
    assert mutations(sim) == []

    # a restore in place is counted too: the guest ends up with the backup's 120 GiB of disk
    res = await call(env, admin(env), "vm_restore_in_place", {"vmid": 103, "archive": big})
    assert res.is_error and "quota.resource_per_guest" in res.structured_content["codes"], text(res)
    assert "lab-restore-in-place" in text(res) and "leaves the guest with 120 GiB of disk" in text(res), text(res)
    assert mutations(sim) == []
