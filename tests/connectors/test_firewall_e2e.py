"""Firewall family end to end: SDK client -> HTTPS -> JWT -> real OPA -> pve_api runtime ->
simulator, with the example organisation's policy.

Every mutation runs through the gateway and must send exactly the request its YAML declares
(the simulator's request log). Calls the default policy holds (cluster-wide changes are high
risk; turning a firewall off is critical and waits for two approvers) are proved unsent, then
run through the gateway's runtime object; the simulator's state shows the effect. The shared
small scenario is left as it was found (other modules count its cluster rules).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.base import CallContext
from tests.connectors.test_provision_e2e import admin, call, read, run, sent, text
from tests.support import GatewayThread, per_module

FIREWALL_TOOLS = {
    "firewall_alias_create",
    "firewall_alias_delete",
    "firewall_alias_update",
    "firewall_aliases",
    "firewall_cluster_options",
    "firewall_cluster_options_set",
    "firewall_cluster_rule_create",
    "firewall_cluster_rule_delete",
    "firewall_cluster_rule_update",
    "firewall_group_create",
    "firewall_group_delete",
    "firewall_group_rule_create",
    "firewall_group_rule_delete",
    "firewall_group_rules",
    "firewall_groups",
    "firewall_guest_log",
    "firewall_guest_options",
    "firewall_guest_options_set",
    "firewall_guest_rule_create",
    "firewall_guest_rule_delete",
    "firewall_guest_rule_update",
    "firewall_ipset_add",
    "firewall_ipset_create",
    "firewall_ipset_delete",
    "firewall_ipset_entries",
    "firewall_ipset_remove",
    "firewall_ipsets",
    "firewall_node_log",
    "firewall_node_options",
    "firewall_node_options_set",
    "firewall_node_rule_create",
    "firewall_node_rule_delete",
    "firewall_node_rule_update",
    "firewall_node_rules",
}
API = "/api2/json"
FW = f"{API}/cluster/firewall"


def network_admin(env: DevEnv) -> str:
    return env.token(per_module("nora"), [], groups=["network-admins"], kind="human")


async def rules(env: DevEnv, tool: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return list((await read(env, tool, args))["items"])


def deletes(sim: Any) -> list[tuple[str, dict[str, list[str]]]]:
    return [(e["path"], parse_qs(e["query"])) for e in sim.requests_log() if e["method"] == "DELETE"]


async def test_cluster_rules_aliases_ipsets_and_groups(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    before = await rules(env, "list_firewall_rules", {})
    await run(
        gateway, env, sim, "firewall_alias_create", {"name": "mgmt", "cidr": "10.10.0.0/24", "comment": "management"},
        ("POST", f"{FW}/aliases", {"name": "mgmt", "cidr": "10.10.0.0/24", "comment": "management"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_alias_update", {"name": "mgmt", "cidr": "10.10.0.0/23"},
        ("PUT", f"{FW}/aliases/mgmt", {"cidr": "10.10.0.0/23"}),
    )  # fmt: skip
    assert [(a["name"], a["cidr"]) for a in await rules(env, "firewall_aliases", {})] == [("mgmt", "10.10.0.0/23")]
    dup = await direct(gateway, "firewall_alias_create", {"name": "MGMT", "cidr": "10.0.0.1"})
    assert "alias 'MGMT' already exists" in dup

    await run(
        gateway, env, sim, "firewall_ipset_create", {"name": "blocklist", "comment": "known bad"},
        ("POST", f"{FW}/ipset", {"name": "blocklist", "comment": "known bad"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_ipset_add", {"name": "blocklist", "cidr": "203.0.113.0/24"},
        ("POST", f"{FW}/ipset/blocklist", {"cidr": "203.0.113.0/24"}),
    )  # fmt: skip
    entries = await rules(env, "firewall_ipset_entries", {"name": "blocklist"})
    assert [e["cidr"] for e in entries] == ["203.0.113.0/24"]
    assert [s["name"] for s in await rules(env, "firewall_ipsets", {})] == ["blocklist"]

    await run(
        gateway, env, sim, "firewall_group_create", {"group": "webservers", "comment": "web tier"},
        ("POST", f"{FW}/groups", {"group": "webservers", "comment": "web tier"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_group_rule_create",
        {"group": "webservers", "type": "in", "action": "ACCEPT", "macro": "HTTPS", "enable": True},
        ("POST", f"{FW}/groups/webservers", {"type": "in", "action": "ACCEPT", "macro": "HTTPS", "enable": "1"}),
    )  # fmt: skip
    grp = await rules(env, "firewall_group_rules", {"group": "webservers"})
    assert [(r["pos"], r["macro"], r["enable"]) for r in grp] == [(0, "HTTPS", 1)]
    assert [g["group"] for g in await rules(env, "firewall_groups", {})] == ["webservers"]

    # a cluster rule goes to the top; created disabled unless enable was passed (PVE's default)
    await run(
        gateway, env, sim, "firewall_cluster_rule_create",
        {"type": "in", "action": "DROP", "source": "+blocklist", "comment": "drop known bad"},
        ("POST", f"{FW}/rules", {"type": "in", "action": "DROP", "source": "+blocklist", "comment": "drop known bad"}),
    )  # fmt: skip
    now = await rules(env, "list_firewall_rules", {})
    assert len(now) == len(before) + 1
    assert (now[0]["pos"], now[0]["source"], now[0]["enable"]) == (0, "+blocklist", 0)
    assert [r.get("comment") for r in now[1:]] == [r.get("comment") for r in before]
    await run(
        gateway, env, sim, "firewall_cluster_rule_update", {"pos": 0, "enable": True},
        ("PUT", f"{FW}/rules/0", {"enable": "1"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_cluster_rule_update", {"pos": 0, "moveto": 2},
        ("PUT", f"{FW}/rules/0", {"moveto": "2"}),
    )  # fmt: skip
    now = await rules(env, "list_firewall_rules", {})
    moved = next(r for r in now if r.get("source") == "+blocklist")
    assert (moved["pos"], moved["enable"]) == (1, 1)  # PVE moves before the rule at moveto
    await run(
        gateway, env, sim, "firewall_cluster_rule_delete", {"pos": 1, "digest": moved["digest"]},
        ("DELETE", f"{FW}/rules/1", None),
    )  # fmt: skip
    assert deletes(sim) == [(f"{FW}/rules/1", {"digest": [moved["digest"]]})]
    assert [r.get("comment") for r in await rules(env, "list_firewall_rules", {})] == [r.get("comment") for r in before]

    # a stale digest is PVE's refusal, not a change to whatever rule is at that position now
    stale = await direct(gateway, "firewall_cluster_rule_delete", {"pos": 0, "digest": moved["digest"]})
    assert "detected modified configuration" in stale
    assert len(await rules(env, "list_firewall_rules", {})) == len(before)

    await run(
        gateway, env, sim, "firewall_ipset_remove", {"name": "blocklist", "cidr": "203.0.113.0/24"},
        ("DELETE", f"{FW}/ipset/blocklist/203.0.113.0/24", None),
    )  # fmt: skip
    assert await rules(env, "firewall_ipset_entries", {"name": "blocklist"}) == []
    await run(
        gateway, env, sim, "firewall_ipset_delete", {"name": "blocklist"},
        ("DELETE", f"{FW}/ipset/blocklist", None),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_group_rule_delete", {"group": "webservers", "pos": 0},
        ("DELETE", f"{FW}/groups/webservers/0", None),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_group_delete", {"group": "webservers"},
        ("DELETE", f"{FW}/groups/webservers", None),
    )  # fmt: skip
    await run(
        gateway, env, sim, "firewall_alias_delete", {"name": "mgmt"},
        ("DELETE", f"{FW}/aliases/mgmt", None),
    )  # fmt: skip
    assert await rules(env, "firewall_groups", {}) == [] and await rules(env, "firewall_aliases", {}) == []
    missing = await direct(gateway, "firewall_ipset_entries", {"name": "blocklist"})
    assert "no such IPSet 'blocklist'" in missing


async def test_node_rules_options_and_log(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    node = f"{API}/nodes/pve2/firewall"
    rule = {"node": "pve2", "type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22",
            "source": "10.10.0.0/24", "enable": True, "comment": "ssh from mgmt"}  # fmt: skip
    await run(
        gateway, env, sim, "firewall_node_rule_create", rule,
        ("POST", f"{node}/rules", {"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "22",
                                    "source": "10.10.0.0/24", "enable": "1", "comment": "ssh from mgmt"}),
    )  # fmt: skip
    listed = await rules(env, "firewall_node_rules", {"node": "pve2"})
    assert [(r["pos"], r["dport"], r["enable"]) for r in listed] == [(0, "22", 1)]
    await run(
        gateway, env, sim, "firewall_node_rule_update", {"node": "pve2", "pos": 0, "log": "info"},
        ("PUT", f"{node}/rules/0", {"log": "info"}),
    )  # fmt: skip
    assert (await rules(env, "firewall_node_rules", {"node": "pve2"}))[0]["log"] == "info"
    await run(
        gateway, env, sim, "firewall_node_rule_delete", {"node": "pve2", "pos": 0},
        ("DELETE", f"{node}/rules/0", None),
    )  # fmt: skip
    assert await rules(env, "firewall_node_rules", {"node": "pve2"}) == []
    gone = await direct(gateway, "firewall_node_rule_delete", {"node": "pve2", "pos": 0})
    assert "no rule at position 0" in gone

    # a dport without a protocol is PVE's parameter error, answered and nothing stored
    no_proto = {"node": "pve2", "type": "in", "action": "ACCEPT", "dport": "22"}
    bad = await direct(gateway, "firewall_node_rule_create", no_proto)
    assert "requires this property" in bad and await rules(env, "firewall_node_rules", {"node": "pve2"}) == []

    log = await rules(env, "firewall_node_log", {"node": "pve2", "lines": 5})
    assert len(log) == 5 and all("PVEFW" in r["t"] for r in log) and log[-1]["n"] == log[0]["n"] + 4
    assert (await read(env, "firewall_node_options", {"node": "pve2"}))["enable"] == 1

    # turning a node's firewall off is critical: held for two approvers, nothing sent
    verdict = await run(
        gateway, env, sim, "firewall_node_options_set", {"node": "pve2", "enable": False},
        ("PUT", f"{node}/options", {"enable": "0"}),
    )  # fmt: skip
    assert verdict == "held"
    assert (await read(env, "firewall_node_options", {"node": "pve2"}))["enable"] == 0
    await run(
        gateway, env, sim, "firewall_node_options_set", {"node": "pve2", "enable": True, "nosmurfs": True},
        ("PUT", f"{node}/options", {"enable": "1", "nosmurfs": "1"}),
    )  # fmt: skip
    opts = await read(env, "firewall_node_options", {"node": "pve2"})
    assert (opts["enable"], opts["nosmurfs"]) == (1, 1)


async def test_guest_rules_options_and_log(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    vm = f"{API}/nodes/pve2/qemu/103/firewall"
    for action, port in (("ACCEPT", "443"), ("REJECT", "25")):
        await run(
            gateway, env, sim, "firewall_guest_rule_create",
            {"vmid": 103, "type": "in", "action": action, "proto": "tcp", "dport": port, "enable": True},
            ("POST", f"{vm}/rules", {"type": "in", "action": action, "proto": "tcp", "dport": port, "enable": "1"}),
        )  # fmt: skip
    listed = await rules(env, "get_guest_firewall_rules", {"vmid": 103})
    assert [(r["pos"], r["action"]) for r in listed] == [(0, "REJECT"), (1, "ACCEPT")]
    await run(
        gateway, env, sim, "firewall_guest_rule_update",
        {"vmid": 103, "pos": 0, "moveto": 2, "digest": listed[0]["digest"]},
        ("PUT", f"{vm}/rules/0", {"moveto": "2", "digest": listed[0]["digest"]}),
    )  # fmt: skip
    listed = await rules(env, "get_guest_firewall_rules", {"vmid": 103})
    assert [r["action"] for r in listed] == ["ACCEPT", "REJECT"]
    await run(
        gateway, env, sim, "firewall_guest_rule_delete", {"vmid": 103, "pos": 1},
        ("DELETE", f"{vm}/rules/1", None),
    )  # fmt: skip
    assert [r["action"] for r in await rules(env, "get_guest_firewall_rules", {"vmid": 103})] == ["ACCEPT"]
    res = await call(env, admin(env), "firewall_guest_rule_delete", {"vmid": 103, "pos": 7})
    assert res.is_error and "no rule at position 7" in text(res)  # allowed, sent, PVE's error

    ct = f"{API}/nodes/pve2/lxc/202/firewall"
    await run(
        gateway, env, sim, "firewall_guest_rule_create",
        {"vmid": 202, "type": "out", "action": "DROP", "dest": "10.10.9.0/24"},
        ("POST", f"{ct}/rules", {"type": "out", "action": "DROP", "dest": "10.10.9.0/24"}),
    )  # fmt: skip
    assert (await rules(env, "get_guest_firewall_rules", {"vmid": 202}))[0]["enable"] == 0

    await run(
        gateway, env, sim, "firewall_guest_options_set",
        {"vmid": 103, "enable": True, "policy_in": "DROP", "ipfilter": True},
        ("PUT", f"{vm}/options", {"enable": "1", "policy_in": "DROP", "ipfilter": "1"}),
    )  # fmt: skip
    opts = await read(env, "firewall_guest_options", {"vmid": 103})
    assert (opts["enable"], opts["policy_in"], opts["ipfilter"]) == (1, "DROP", 1)
    verdict = await run(
        gateway, env, sim, "firewall_guest_options_set", {"vmid": 103, "enable": False},
        ("PUT", f"{vm}/options", {"enable": "0"}),
    )  # fmt: skip
    assert verdict == "held"  # any firewall off is critical
    log = await rules(env, "firewall_guest_log", {"vmid": 103, "lines": 3})
    assert len(log) == 3 and "tap103i0" in log[0]["t"]


async def test_cluster_firewall_off_is_critical_and_four_eyes(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    assert (await read(env, "firewall_cluster_options", {}))["enable"] == 1
    sim.clear_logs()
    res = await call(env, network_admin(env), "firewall_cluster_options_set", {"enable": False})
    assert res.is_error and sent(sim) == []
    pending = (res.structured_content or {})["approval"]
    assert pending["min_approvals"] == 2 and "critical" in pending["reason"]

    # a rehearsal changes nothing: not critical, allowed, nothing sent
    dry = await call_dry(env, network_admin(env), "firewall_cluster_options_set", {"enable": False})
    assert not dry.is_error and sent(sim) == []
    assert (dry.structured_content or {})["would_send"]["body"] == {"enable": 0}

    verdict = await run(
        gateway, env, sim, "firewall_cluster_options_set", {"enable": False, "policy_in": "ACCEPT"},
        ("PUT", f"{FW}/options", {"enable": "0", "policy_in": "ACCEPT"}),
    )  # fmt: skip
    assert verdict == "held"
    assert (await read(env, "firewall_cluster_options", {}))["enable"] == 0
    await run(
        gateway, env, sim, "firewall_cluster_options_set", {"enable": True, "policy_in": "DROP"},
        ("PUT", f"{FW}/options", {"enable": "1", "policy_in": "DROP"}),
    )  # fmt: skip
    assert (await read(env, "firewall_cluster_options", {}))["enable"] == 1


async def test_network_admin_role(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    rule = {"vmid": 103, "type": "in", "action": "ACCEPT"}
    res = await call(env, network_admin(env), "firewall_guest_rule_create", rule)
    assert not res.is_error, text(res)
    rows = await rules(env, "get_guest_firewall_rules", {"vmid": 103})
    gone = {"vmid": 103, "pos": 0, "digest": rows[0]["digest"]}
    assert not (await call(env, network_admin(env), "firewall_guest_rule_delete", gone)).is_error
    assert [e["method"] for e in sim.requests_log() if e["method"] != "GET"] == ["POST", "DELETE"]
    sim.clear_logs()
    denied = await call(env, network_admin(env), "vm_stop", {"vmid": 103})
    assert denied.is_error and "Denied" in text(denied) and sent(sim) == []


async def call_dry(env: DevEnv, token: str, name: str, args: dict[str, Any]) -> Any:
    from gateway.dev.client import mcp_client

    async with mcp_client(env.url, token, env.ca_file) as client:
        return await client.call_tool(name, args, meta={"dry_run": True})


async def direct(gw: GatewayThread, name: str, args: dict[str, Any]) -> str:
    """Run a connector through the gateway's runtime (past the policy) and return its error text."""
    c = gw.components
    tool = c.catalog.get(name)
    assert tool is not None and gw.loop is not None
    run_it = c.runtime(tool).call(tool, tool.validate(args), CallContext("default"))
    fut = asyncio.run_coroutine_threadsafe(run_it, gw.loop)
    try:
        fut.result(timeout=60)
    except Exception as exc:  # the connector's ToolError with PVE's message
        return str(exc)
    raise AssertionError(f"{name} did not fail")


def test_every_firewall_tool_is_called_here() -> None:
    """FIREWALL_TOOLS (counted by test_tools_e2e) names only tools this module runs."""
    source = Path(__file__).read_text().split("FIREWALL_TOOLS = {", 1)[1].split("}", 1)[1]
    assert all(f'"{name}"' in source for name in FIREWALL_TOOLS)
