"""SDN family end to end: SDK client -> HTTPS -> JWT -> real OPA -> pve_api runtime -> simulator,
with the example organisation's policy.

Zone, vnet and subnet changes are pending until sdn_apply, which reloads every node's network:
the example policy holds every cluster-wide SDN change for an approval and makes the apply
critical (two approvers). Each mutation must send exactly the request its YAML declares;
calls the policy holds are proved unsent, then run through the gateway's runtime object.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import httpx

from gateway.dev.devenv import DevEnv
from tests.connectors.test_firewall_e2e import call_dry, direct, network_admin
from tests.connectors.test_provision_e2e import call, read, run, sent
from tests.support import GatewayThread, database_bytes

SDN_TOOLS = {
    "sdn_apply",
    "sdn_ipam_status",
    "sdn_ipams",
    "sdn_subnet_create",
    "sdn_subnet_delete",
    "sdn_subnet_update",
    "sdn_subnets",
    "sdn_vnet_create",
    "sdn_vnet_delete",
    "sdn_vnet_update",
    "sdn_vnets",
    "sdn_zone_create",
    "sdn_zone_delete",
    "sdn_zone_update",
    "sdn_zones",
}
SDN = "/api2/json/cluster/sdn"


async def items(env: DevEnv, tool: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return list((await read(env, tool, args))["items"])


async def test_zones_vnets_subnets_pending_and_apply(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    assert [i["ipam"] for i in await items(env, "sdn_ipams", {})] == ["pve"]
    await run(
        gateway, env, sim, "sdn_zone_create", {"zone": "lab", "type": "vlan", "bridge": "vmbr0", "mtu": 1500},
        ("POST", f"{SDN}/zones", {"zone": "lab", "type": "vlan", "bridge": "vmbr0", "mtu": "1500"}),
    )  # fmt: skip
    pending = await items(env, "sdn_zones", {"pending": True})
    assert [(z["zone"], z["state"]) for z in pending] == [("lab", "new")]
    assert await items(env, "sdn_zones", {}) != [] and "already defined" in await direct(
        gateway, "sdn_zone_create", {"zone": "lab", "type": "simple"}
    )
    assert "missing bridge" in await direct(gateway, "sdn_zone_create", {"zone": "lab2", "type": "vlan"})

    await run(
        gateway, env, sim, "sdn_vnet_create", {"vnet": "labnet", "zone": "lab", "tag": 20, "alias": "lab network"},
        ("POST", f"{SDN}/vnets", {"vnet": "labnet", "zone": "lab", "tag": "20", "alias": "lab network"}),
    )  # fmt: skip
    assert "missing vlan tag" in await direct(gateway, "sdn_vnet_create", {"vnet": "notag", "zone": "lab"})
    await run(
        gateway, env, sim, "sdn_subnet_create",
        {"vnet": "labnet", "subnet": "10.20.0.0/24", "gateway": "10.20.0.1", "snat": True},
        ("POST", f"{SDN}/vnets/labnet/subnets",
         {"subnet": "10.20.0.0/24", "gateway": "10.20.0.1", "snat": "1", "type": "subnet"}),
    )  # fmt: skip
    bad = {"vnet": "labnet", "subnet": "10.21.0.0/24", "gateway": "10.99.0.1"}
    assert "is not part of subnet" in await direct(gateway, "sdn_subnet_create", bad)
    subnets = await items(env, "sdn_subnets", {"vnet": "labnet", "pending": True})
    assert [(s["subnet"], s["state"]) for s in subnets] == [("lab-10.20.0.0-24", "new")]
    assert await items(env, "sdn_ipam_status", {"ipam": "pve"}) == []  # nothing applied yet

    # applying is critical: held for two approvers, nothing sent; a rehearsal is allowed and sends nothing
    sim.clear_logs()
    held = await call(env, network_admin(env), "sdn_apply", {})
    assert held.is_error and sent(sim) == []
    approval = (held.structured_content or {})["approval"]
    assert approval["min_approvals"] == 2 and "critical" in approval["reason"]
    rehearsal = await call_dry(env, network_admin(env), "sdn_apply", {})
    assert not rehearsal.is_error and sent(sim) == []
    assert (rehearsal.structured_content or {})["would_send"] == {
        "method": "PUT", "path": "/cluster/sdn", "query": {}, "body": {}
    }  # fmt: skip
    assert await run(gateway, env, sim, "sdn_apply", {}, ("PUT", SDN, {})) == "held"
    assert all("state" not in z for z in await items(env, "sdn_zones", {"pending": True}))
    ipam = await items(env, "sdn_ipam_status", {"ipam": "pve"})
    assert [(r["vnet"], r["ip"], r["gateway"]) for r in ipam] == [("labnet", "10.20.0.1", 1)]

    await run(
        gateway, env, sim, "sdn_zone_update", {"zone": "lab", "mtu": 1400},
        ("PUT", f"{SDN}/zones/lab", {"mtu": "1400"}),
    )  # fmt: skip
    zone = (await items(env, "sdn_zones", {"pending": True}))[0]
    assert (zone["state"], zone["pending"], zone["mtu"]) == ("changed", {"mtu": 1400}, 1500)
    await run(
        gateway, env, sim, "sdn_vnet_update", {"vnet": "labnet", "alias": "lab"},
        ("PUT", f"{SDN}/vnets/labnet", {"alias": "lab"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "sdn_subnet_update", {"vnet": "labnet", "subnet": "lab-10.20.0.0-24", "snat": False},
        ("PUT", f"{SDN}/vnets/labnet/subnets/lab-10.20.0.0-24", {"snat": "0"}),
    )  # fmt: skip
    assert (await items(env, "sdn_subnets", {"vnet": "labnet"}))[0]["snat"] == 0

    # PVE's order of removal: a zone with a vnet, a vnet with a subnet, are refused
    assert "still using it" in await direct(gateway, "sdn_zone_delete", {"zone": "lab"})
    assert "subnets exists" in await direct(gateway, "sdn_vnet_delete", {"vnet": "labnet"})
    await run(
        gateway, env, sim, "sdn_subnet_delete", {"vnet": "labnet", "subnet": "lab-10.20.0.0-24"},
        ("DELETE", f"{SDN}/vnets/labnet/subnets/lab-10.20.0.0-24", None),
    )  # fmt: skip
    await run(gateway, env, sim, "sdn_vnet_delete", {"vnet": "labnet"}, ("DELETE", f"{SDN}/vnets/labnet", None))
    await run(gateway, env, sim, "sdn_zone_delete", {"zone": "lab"}, ("DELETE", f"{SDN}/zones/lab", None))
    assert [(z["zone"], z["state"]) for z in await items(env, "sdn_zones", {"pending": True})] == [("lab", "deleted")]
    assert "does not exist" in await direct(gateway, "sdn_zone_delete", {"zone": "lab"})
    await run(gateway, env, sim, "sdn_apply", {}, ("PUT", SDN, {}))
    assert await items(env, "sdn_zones", {"pending": True}) == [] and await items(env, "sdn_vnets", {}) == []


def test_every_sdn_tool_is_called_here() -> None:
    """SDN_TOOLS (counted by test_tools_e2e) names only tools this module runs."""
    source = Path(__file__).read_text().split("SDN_TOOLS = {", 1)[1].split("}", 1)[1]
    assert all(f'"{name}"' in source for name in SDN_TOOLS)


async def test_an_ipam_token_never_leaves(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    """A netbox IPAM's API token sits in the SDN configuration Proxmox answers with; the
    gateway's answer and its audit never carry it."""
    token = "NetboxApiToken-planted-4c1d9e"
    netbox = {"ipam": "netbox", "type": "netbox", "url": "https://netbox.example/api", "token": token}
    tls = ssl.create_default_context(cafile=str(sim.ca_file))
    async with httpx.AsyncClient(verify=tls, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}) as h:
        r = await h.post(f"{sim.api_url}/cluster/sdn/ipams", data=netbox)
        assert r.status_code == 200, r.text
        raw = (await h.get(f"{sim.api_url}/cluster/sdn/ipams")).text
    assert token in raw  # Proxmox does answer with it
    res = await call(env, network_admin(env), "sdn_ipams", {})
    assert not res.is_error
    assert {i["ipam"]: i.get("type") for i in (res.structured_content or {})["items"]} == {
        "pve": "pve",
        "netbox": "netbox",
    }
    assert token not in json.dumps(res.structured_content) and all(
        token not in getattr(c, "text", "") for c in res.content
    )
    assert token.encode() not in database_bytes(env.config.audit_path)
