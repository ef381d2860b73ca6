"""Replacing a guest NIC never turns its firewall off by omission (security review finding).

Proxmox keeps a NIC as one property string (`net0: virtio=BC:24:11:..,bridge=vmbr0,firewall=1`)
and setting `netN` replaces the whole string: a flag the new string leaves out is gone. The NIC
tools used to leave `firewall=` out when the caller omitted the argument, so an agent replacing a
NIC that had `firewall=1` turned that NIC's firewall off, an ordinary write, without the critical
risk the example policy gives an explicit `firewall: false`. The `firewall` parameter now defaults
to true (connectors/provision.yaml): the gateway fills it in before the decision, the policy sees
it and Proxmox gets it. Through the live gateway (HTTPS, JWT, real OPA, the shipped policy) to the
simulator, which replaces netN whole as Proxmox does.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gateway.dev.devenv import DevEnv
from gateway.tools.catalog import Catalog
from tests.connectors.test_provision_e2e import API, call, sent, text
from tests.support import GatewayThread, audit_rows, per_module

CONNECTORS = Path(__file__).resolve().parents[2] / "connectors"
INDEX = 7  # a spare slot on the session simulator's guests, removed again at the end


def agent(env: DevEnv) -> str:
    return env.token(per_module("nic-agent"), ["operator"], kind="agent")


def outcome(res: Any) -> str:
    return str((res.meta or {}).get("pvegate/outcome"))


async def nic(env: DevEnv, vmid: int) -> dict[str, Any]:
    res = await call(env, agent(env), "get_guest_config", {"vmid": vmid})
    assert not res.is_error, text(res)
    config = res.structured_content
    return next(n for n in config["networks"] if n["interface"] == f"net{INDEX}")


async def set_nic(env: DevEnv, sim: Any, tool: str, args: dict[str, Any]) -> Any:
    sim.clear_logs()
    res = await call(env, agent(env), tool, args)
    assert not res.is_error and outcome(res) == "allowed", text(res)
    return res


def decided(env: DevEnv, res: Any) -> dict[str, Any]:
    """The arguments the policy decided on (the audit's `received` record)."""
    rows = audit_rows(env.config.audit_path, res.meta["pvegate/request_id"])
    return dict(next(json.loads(r["body"])["arguments"] for r in rows if r["kind"] == "received"))


async def replace_without_firewall(
    env: DevEnv, sim: Any, tool: str, vmid: int, base: dict[str, Any], path: str, line: str
) -> None:
    args = {"vmid": vmid, "index": INDEX, **base}
    try:
        # a NIC with its firewall on, and a VLAN tag
        await set_nic(env, sim, tool, {**args, "vlan": 30, "firewall": True})
        before = await nic(env, vmid)
        assert (before["firewall"], before["vlan"]) == (True, 30), before

        # replaced by an agent that does not mention the firewall: the flag stays on
        res = await set_nic(env, sim, tool, args)
        after = await nic(env, vmid)
        assert after["vlan"] is None, after  # the whole string was replaced: the tag is gone ...
        assert after["firewall"] is True, f"{tool} without `firewall` turned the NIC's firewall off: {after}"
        assert decided(env, res)["firewall"] is True  # ... the policy decided on the flag sent
        assert sent(sim) == [("PUT", path, {f"net{INDEX}": line})], sent(sim)

        # turning it off is said out loud, and critical: two approvers, nothing sent
        sim.clear_logs()
        off = await call(env, agent(env), tool, {**args, "firewall": False})
        assert off.is_error and outcome(off) == "pending_approval", text(off)
        rows = audit_rows(env.config.audit_path, off.meta["pvegate/request_id"])
        decision = next(r["body"] for r in rows if r["kind"] == "decision")
        assert "critical_call:nic-firewall-off" in decision, decision
        assert sent(sim) == []
        assert (await nic(env, vmid))["firewall"] is True
    finally:
        gone = await call(env, agent(env), "guest_nic_remove", {"vmid": vmid, "index": INDEX})
        assert not gone.is_error, text(gone)


async def test_vm_nic_replaced_without_firewall_keeps_it_on(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    await replace_without_firewall(
        env, sim, "vm_nic_set", 103, {"model": "virtio", "bridge": "vmbr0"},
        f"{API}/pve2/qemu/103/config", "virtio,bridge=vmbr0,firewall=1",
    )  # fmt: skip


async def test_container_nic_replaced_without_firewall_keeps_it_on(
    gateway: GatewayThread, env: DevEnv, sim: Any
) -> None:
    await replace_without_firewall(
        env, sim, "lxc_nic_set", 202, {"ifname": "eth7", "bridge": "vmbr0", "ip_cidr": "dhcp"},
        f"{API}/pve2/lxc/202/config", "name=eth7,bridge=vmbr0,ip=dhcp,firewall=1",
    )  # fmt: skip


def test_every_nic_line_sends_the_firewall_flag() -> None:
    """Each tool that sets a netN line (the NIC tools and the creates) sends `firewall=` whether or
    not the caller gave it: on by default, off only when said (nothing left to Proxmox's default,
    which is off)."""
    catalog = Catalog.load(CONNECTORS)
    nic_lines = {
        tool.name: parts
        for tool in catalog.tools.values()
        for field, parts in (tool.spec.get("body") or {}).items()
        if re.fullmatch(r"net([0-9]+|\{[a-z_]+\})", field) and isinstance(parts, list)
    }
    assert set(nic_lines) == {"vm_create", "lxc_create", "vm_nic_set", "lxc_nic_set"}, nic_lines
    for name, parts in nic_lines.items():
        tool = catalog.get(name)
        assert tool is not None
        assert ",firewall={firewall}" in parts, (name, parts)
        assert tool.parameters["properties"]["firewall"]["default"] is True, name
        assert tool.mcp_view["inputSchema"]["properties"]["firewall"]["default"] is True  # clients are told
