"""A pool's usage and a clone's size, as the resource quotas count them, end to end: SDK client ->
HTTPS -> JWT -> real OPA -> gateway -> simulator.

/cluster/resources' maxdisk is a guest's boot disk only and a container's maxmem has no swap,
so the gateway sizes each pool member, and a clone's source, from its configuration (GET
/nodes/{node}/{type}/{vmid}/config), counted as a create counts its arguments: every disk
(attached, mounted or grown since), a container's memory plus its swap. A member or source
whose config cannot be read is unknown, and the policy refuses what it cannot check. The
policy is the repository's library and example data, with the sandbox pool's limits lowered
so the simulator's storage reaches them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.connectors.test_provision_e2e import TEMPLATE, call, text
from tests.support import GatewayThread, example_env, mutations
from tests.support import resource_facts as facts

POOL_LIMIT = {"guests": 10, "cores": 100, "memory_mib": 1_000_000, "disk_gib": 150}


@pytest.fixture(scope="module")
def psim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("pool-sim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def penv(psim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    def edit(data: dict[str, Any]) -> None:
        for q in data["resource_quotas"]:
            if q["name"] == "provisioners-in-sandbox":
                q["max_pool_total"] = dict(POOL_LIMIT)

    return example_env(tmp_path_factory.mktemp("pool"), psim, edit)


@pytest.fixture(scope="module")
def pgw(penv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(penv.config).start()
    yield gw
    gw.stop()


def provisioner(env: DevEnv) -> str:
    return env.token("pool-usage-agent", ["provisioner"], kind="agent")


async def ok(env: DevEnv, name: str, args: dict[str, Any]) -> None:
    res = await call(env, provisioner(env), name, args)
    assert not res.is_error, f"{name}: {text(res)}"


def attach(index: int, gib: int) -> dict[str, Any]:
    return {"vmid": 190, "index": index, "storage": "local-lvm", "disk_gib": gib}


def usage(gw: GatewayThread) -> dict[str, int]:
    """Pool sandbox's usage, as the next allocating call there is decided on."""
    u = facts(gw, "vm_disk_attach", attach(9, 1))["pool_usage"]
    assert u is not None
    return dict(u)


async def test_every_disk_and_a_containers_swap_count_toward_the_pool(
    pgw: GatewayThread, penv: DevEnv, psim: Any
) -> None:
    env, sim = penv, psim
    await ok(
        env, "vm_create", {"node": "pve1", "vmid": 190, "pool": "sandbox", "disk_storage": "local-lvm", "disk_gib": 8}
    )
    assert usage(pgw) == {"guests": 1, "cores": 1, "memory_mib": 512, "disk_gib": 8}
    # a disk attached, then grown: the pool holds them (maxdisk still shows the boot disk's 8 GiB)
    await ok(env, "vm_disk_attach", attach(1, 40))
    assert usage(pgw)["disk_gib"] == 48
    await ok(env, "guest_disk_resize", {"vmid": 190, "disk": "scsi1", "grow_gib": 10})
    assert usage(pgw)["disk_gib"] == 58

    # a container: its swap counts in the pool as it counted in its create; a mount point's volume too
    ct = {"node": "pve1", "vmid": 191, "pool": "sandbox", "template_storage": "local", "template": TEMPLATE,
          "disk_storage": "local-lvm", "disk_gib": 2, "hostname": "ct-pool", "memory": 1024, "swap": 3000}  # fmt: skip
    asked = facts(pgw, "lxc_create", ct)
    assert asked["requested"] == {"guests": 1, "cores": 1, "memory_mib": 4024, "disk_gib": 2}, asked
    await ok(env, "lxc_create", ct)
    assert usage(pgw) == {"guests": 2, "cores": 2, "memory_mib": 512 + 4024, "disk_gib": 60}
    await ok(
        env, "lxc_mountpoint_add", {"vmid": 191, "index": 0, "storage": "local-lvm", "disk_gib": 5, "path": "/srv"}
    )
    assert usage(pgw)["disk_gib"] == 65

    # the limit (150 GiB) holds against every disk: 65 + 64 fits, 129 + 30 does not
    await ok(env, "vm_disk_attach", attach(2, 64))
    sim.clear_logs()
    res = await call(env, provisioner(env), "vm_disk_attach", attach(3, 30))
    assert res.is_error and "quota.resource_pool_total" in res.structured_content["codes"], text(res)
    assert "holds 129 GiB of disk" in text(res), text(res)
    assert mutations(sim) == []


async def test_a_clone_asks_for_its_sources_size(pgw: GatewayThread, penv: DevEnv, psim: Any) -> None:
    env, sim = penv, psim
    # VM 190 (made above): 8 + 50 + 64 GiB; a clone copies every disk, not only the boot disk
    clone = {"vmid": 190, "newid": 192, "name": "big-clone", "pool": "sandbox", "full": True}
    f = facts(pgw, "guest_clone", clone)
    assert f["requested"] == {"guests": 1, "cores": 1, "memory_mib": 512, "disk_gib": 122}, f
    sim.clear_logs()
    res = await call(env, provisioner(env), "guest_clone", clone)
    assert res.is_error and "quota.resource_per_guest" in res.structured_content["codes"], text(res)
    assert "asks for 122 GiB of disk" in text(res), text(res)
    assert mutations(sim) == []
    # a container's clone: its memory plus its swap, its root disk and mount point
    f = facts(pgw, "guest_clone", {"vmid": 191, "newid": 193, "name": "ct-clone", "pool": "sandbox"})
    assert f["requested"] == {"guests": 1, "cores": 1, "memory_mib": 4024, "disk_gib": 7}, f


async def test_what_cannot_be_read_is_refused(pgw: GatewayThread, penv: DevEnv, psim: Any) -> None:
    env, sim = penv, psim
    small = {"node": "pve1", "vmid": 194, "pool": "sandbox", "cores": 1, "memory": 256}
    assert facts(pgw, "vm_create", small)["pool_usage"] is not None
    sim.set_faults(error_rate=1.0, error_path=r"^/nodes/[^/]+/lxc/191/config$")
    try:
        # one member's config unreadable: the pool's usage is unknown, and a pool limit refuses
        assert facts(pgw, "vm_create", small)["pool_usage"] is None
        sim.clear_logs()
        res = await call(env, provisioner(env), "vm_create", small)
        assert res.is_error and "quota.resource_pool_unknown" in res.structured_content["codes"], text(res)
        # a clone whose source cannot be sized asks for an unknown size: refused whatever the limits
        f = facts(pgw, "guest_clone", {"vmid": 191, "newid": 195, "name": "ct-clone"})
        assert f["final"] is None, f
        res = await call(
            env, provisioner(env), "guest_clone", {"vmid": 191, "newid": 195, "name": "c", "pool": "sandbox"}
        )
        assert res.is_error and "quota.resource_facts_missing" in res.structured_content["codes"], text(res)
        assert mutations(sim) == []
    finally:
        sim.set_faults(error_rate=0.0, error_path=None)
    await ok(env, "vm_create", small)
