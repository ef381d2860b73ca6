"""A property-string argument given without what it needs, end to end: SDK client -> HTTPS ->
JWT -> real OPA -> pve_api runtime -> simulator.

vm_cloudinit_set with ip_cidr and gateway but no index used to PUT only {ciuser} and report
success; vm_create / lxc_create with vlan but no bridge created a guest without its NIC. Each is
now refused with the field and what it needs, before the policy decides: the simulator's
request log holds no mutation, the audit records an `invalid` refusal, and the guest is unchanged. On a
simulator and gateway of this module's own: the one whole call changes guest 102's settings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from tests.connectors.test_provision_e2e import answered, sent, text
from tests.support import GatewayThread, audit_rows, free_port


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("ptsim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("ptgw"), {"default": sim}, port=free_port())


@pytest.fixture(scope="module")
def gateway(env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(env.config).start()
    yield gw
    gw.stop()


TEMPLATE = "debian-12-standard_12.7-1_amd64.tar.zst"


async def refused(env: DevEnv, sim: Any, name: str, args: dict[str, Any], why: str) -> None:
    sim.clear_logs()
    res = await answered(env, name, args)
    assert res.is_error, text(res)
    assert why in text(res), text(res)
    assert sent(sim) == []  # nothing that changes anything reached Proxmox
    rows = audit_rows(env.config.audit_path, res.meta["pvegate/request_id"])
    # refused as invalid arguments before the policy decides: nothing to decide on, nor to approve
    assert [(r["kind"], r["outcome"]) for r in rows] == [("refusal", "invalid")], rows


async def test_cloudinit_ip_without_index_is_refused(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    args = {"vmid": 102, "ciuser": "ops", "ip_cidr": "10.10.1.77/24", "gateway": "10.10.1.1"}
    await refused(env, sim, "vm_cloudinit_set", args, "ipconfig{index}: ip_cidr, gateway need index")
    args = {"vmid": 102, "ciuser": "ops", "index": 0, "gateway": "10.10.1.1"}
    await refused(env, sim, "vm_cloudinit_set", args, "ipconfig{index}: gateway needs ip_cidr")


async def test_create_nic_without_bridge_is_refused(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    await refused(env, sim, "vm_create", {"node": "pve2", "vmid": 778, "vlan": 20}, "net0: vlan needs bridge")
    args = {"node": "pve2", "vmid": 780, "template_storage": "local", "template": TEMPLATE,
            "disk_storage": "local-lvm", "disk_gib": 4, "vlan": 30, "ip_cidr": "10.10.2.80/24"}  # fmt: skip
    await refused(env, sim, "lxc_create", args, "net0: ip_cidr, vlan need bridge")


async def test_whole_ipconfig_is_still_sent(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    args = {"vmid": 102, "ciuser": "ops", "index": 0, "ip_cidr": "10.10.1.77/24", "gateway": "10.10.1.1"}
    res = await answered(env, "vm_cloudinit_set", args)
    assert not res.is_error, text(res)
    puts = [body for method, _, body in sent(sim) if method == "PUT"]
    assert puts == [{"ciuser": "ops", "ipconfig0": "ip=10.10.1.77/24,gw=10.10.1.1"}], json.dumps(sent(sim))
