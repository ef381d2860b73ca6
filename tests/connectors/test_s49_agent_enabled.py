"""A VM's guest agent counts as configured however Proxmox's `agent` property says so.

`agent` is a property string whose `enabled` key is a PVE boolean: the bare first item or
`enabled=` anywhere in it, written 1, yes, on or true in any case (`agent: true`,
`agent: fstrim_cloned_disks=1,enabled=1`, as `qm set --agent` stores them). The reducers read only
"1" or "enabled=1" as the first item: check_ip_availability then never asked such a VM's agent and
could answer "free" for an address that agent reports in use (a DHCP lease no config names), and
get_guest_config left the agent's addresses out.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.tools.runtimes.base import ToolError
from gateway.tools.runtimes.reducers import check_ip_availability, guest_config_report
from tests.connectors.test_reducers import base, fake

AGENT = {
    "result": [{"hardware-address": "aa:bb:cc:00:00:01", "ip-addresses": [{"ip-address": "10.0.0.9", "prefix": 24}]}]
}


@pytest.mark.parametrize(
    "agent", ["true", "YES", "on", "enabled=1", "fstrim_cloned_disks=1,enabled=1", "1,type=virtio", "type=isa,1"]
)
async def test_an_enabled_agent_is_asked(agent: str) -> None:
    answers = base(get_guest_stored_config={"config": {"agent": agent}}, vm_agent_network=AGENT)
    out = await check_ip_availability(fake(answers), {"ip": "10.0.0.9"}, [])
    assert out["status"] == "in_use", out
    assert "reported by the guest agent of VM 100 (web)" in out["evidence"]


@pytest.mark.parametrize(
    "agent", ["0", "off", "false", "enabled=0", "enabled=no,fstrim_cloned_disks=1", "", "type=isa", "type=isa,0"]
)
async def test_a_disabled_agent_is_not_asked(agent: str) -> None:
    answers = base(get_guest_stored_config={"config": {"agent": agent}}, vm_agent_network=ToolError("not asked"))
    out = await check_ip_availability(fake(answers), {"ip": "10.0.0.9"}, [])
    assert out["status"] == "free", out


async def test_guest_config_adds_the_agents_addresses() -> None:
    stored: dict[str, Any] = {
        "config": {"agent": "fstrim_cloned_disks=1,enabled=1", "net0": "virtio=AA:BB:CC:00:00:01,bridge=vmbr0"},
        "networks": [{"interface": "net0", "model": "virtio", "mac": "AA:BB:CC:00:00:01", "ip": None}],
    }
    sub = fake({"get_guest_stored_config": stored, "vm_agent_network": AGENT})
    out = await guest_config_report(sub, {"vmid": 100}, [])
    assert out["agent"] == {"answered": True, "error": None}
    assert out["networks"][0]["ip"] == "10.0.0.9/24" and out["networks"][0]["ip_source"] == "agent"
