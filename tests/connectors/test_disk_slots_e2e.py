"""A new disk or mount point into a slot that holds one: Proxmox does not refuse it, it puts the new
volume there and keeps the old one as unusedN (unplugged from a running VM), which is a detach, a
destroy-class change. The gateway reads the slot (target.slot) and the guard rails refuse it, and
one that could not be checked. The simulator does what Proxmox does, so a slip would show.

Its own simulator and gateway: the calls change guests' configs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.runtimes.base import CallContext
from tests.connectors.test_provision_e2e import admin, call, text
from tests.support import GatewayThread, audit_rows, free_port, kept_input, mutations


@pytest.fixture(scope="module")
def ssim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("slot-sim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def senv(ssim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("slot-gw"), {"default": ssim}, port=free_port())


@pytest.fixture(scope="module")
def sgw(senv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(senv.config).start()
    yield gw
    gw.stop()


def slot_fact(env: DevEnv, res: Any) -> Any:
    rows = audit_rows(env.config.audit_path, res.meta["pvegate/request_id"])
    decision = next(r for r in rows if r["kind"] == "decision")
    return kept_input(decision)["target"].get("slot")


ATTACH = {"vmid": 103, "storage": "local-lvm", "disk_gib": 1}


async def test_an_attach_into_a_disk_slot_in_use_is_refused_and_nothing_is_sent(
    sgw: GatewayThread, senv: DevEnv, ssim: Any
) -> None:
    assert "scsi0" in ssim.state()["guests"]["103"]["config"]
    ssim.clear_logs()
    res = await call(senv, admin(senv), "vm_disk_attach", {**ATTACH, "index": 0})
    assert res.is_error and "guardrail.slot_in_use" in res.structured_content["codes"], text(res)
    assert "scsi0 of guest 103 holds a disk: a new one there would detach it" in text(res), text(res)
    assert mutations(ssim) == []
    assert slot_fact(senv, res) == {"name": "scsi0", "in_use": True}
    # a free slot is no slot refusal (the call may still need what else the policy asks)
    res = await call(senv, admin(senv), "vm_disk_attach", {**ATTACH, "index": 7})
    assert "guardrail.slot" not in json.dumps((res.structured_content or {}).get("codes", [])), text(res)
    assert slot_fact(senv, res) == {"name": "scsi7", "in_use": False}


async def test_a_mount_point_in_use_is_refused(sgw: GatewayThread, senv: DevEnv, ssim: Any) -> None:
    args = {"vmid": 202, "index": 0, "storage": "local-lvm", "disk_gib": 1, "path": "/srv/x"}
    if "mp0" not in ssim.state()["guests"]["202"]["config"]:  # an mp0 first, through the runtime (no policy asked)
        await on_gateway(sgw, "lxc_mountpoint_add", args)
        assert "mp0" in ssim.state()["guests"]["202"]["config"]
    ssim.clear_logs()
    res = await call(senv, admin(senv), "lxc_mountpoint_add", args)
    assert res.is_error and "guardrail.slot_in_use" in res.structured_content["codes"], text(res)
    assert mutations(ssim) == []


async def test_a_slot_that_cannot_be_read_is_refused(sgw: GatewayThread, senv: DevEnv, ssim: Any) -> None:
    ssim.set_faults(error_rate=1.0, error_status=500, error_path=r"^/nodes/[^/]+/qemu/103/pending$")
    try:
        ssim.clear_logs()
        res = await call(senv, admin(senv), "vm_disk_attach", {**ATTACH, "index": 6})
    finally:
        ssim.set_faults(error_rate=0)
    assert res.is_error and "guardrail.slot_unknown" in res.structured_content["codes"], text(res)
    assert mutations(ssim) == []


async def test_the_simulator_replaces_a_disk_in_use_as_proxmox_does(sgw: GatewayThread, ssim: Any) -> None:
    """What the guard rail prevents, sent past the policy through the runtime: the old disk is kept as
    unusedN and the new one takes the slot (qemu-server: the old drive is registered as unused)."""
    before = ssim.state()["guests"]["102"]["config"]
    old = before["scsi0"].split(",", 1)[0]
    await on_gateway(sgw, "vm_disk_attach", {"vmid": 102, "index": 0, "storage": "local-lvm", "disk_gib": 1})
    after = ssim.state()["guests"]["102"]["config"]
    assert after["scsi0"].split(",", 1)[0] != old
    assert old in [v for k, v in after.items() if k.startswith("unused")], after


async def on_gateway(gw: GatewayThread, name: str, args: dict[str, Any]) -> Any:
    """The connector alone, on the gateway's loop: what Proxmox does with the call, no policy asked."""
    c = gw.components
    tool = c.catalog.get(name)
    assert tool is not None and gw.loop is not None
    fut = asyncio.run_coroutine_threadsafe(
        c.runtime(tool).call(tool, tool.validate(args), CallContext("default")), gw.loop
    )
    return await asyncio.wrap_future(fut)
