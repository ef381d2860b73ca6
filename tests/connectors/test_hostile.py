"""Hostile arguments are refused before anything leaves the gateway.

Proof is the simulator's own logs: after every refused call, requests_log() and
ssh_log() are empty, so no API request and no SSH exec happened.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, ToolError
from gateway.tools.runtimes.pve_api import render_path
from gateway.tools.runtimes.ssh import AllowList, Refused, render_argv, safe_value
from gateway.tools.tool import ArgumentError
from tests.connectors.test_tools_e2e import admin, auditor, call, text
from tests.support import GatewayThread

HOSTILE: list[tuple[str, dict[str, Any]]] = [
    # argument injection into SSH placeholders
    ("lxc_docker_inspect", {"vmid": 200, "container": "x;id"}),
    ("lxc_docker_inspect", {"vmid": 200, "container": "--format={{json .Config.Env}}"}),
    ("lxc_docker_inspect", {"vmid": 200, "container": "-v"}),
    ("lxc_docker_inspect", {"vmid": 200, "container": "app-db-1 --format x"}),
    ("lxc_docker_inspect", {"vmid": 200, "container": "$(id)"}),
    ("lxc_docker_inspect", {"vmid": 200, "container": ""}),
    ("node_ping", {"node": "pve1", "ip": "10.0.0.1;reboot"}),
    ("node_ping", {"node": "pve1", "ip": "-f"}),
    ("node_ping", {"node": "pve1", "ip": "10.0.0.1\n"}),
    ("node_arp_table", {"node": "pve1 && id"}),
    ("inspect_compose_stack", {"vmid": 200, "project": "app`id`"}),
    # path traversal in path parameters
    ("get_node_capacity", {"node": "../../access/users"}),
    ("get_node_capacity", {"node": ".."}),
    ("get_node_capacity", {"node": "pve1/../../cluster"}),
    ("get_node_capacity", {"node": "pve1%2F.."}),
    ("get_node_capacity", {"node": "pve1\n"}),
    ("list_storage_content", {"node": "pve1", "storage": "../../../etc"}),
    ("get_task_status", {"upid": "UPID:pve1:../../x"}),
    ("snapshot_delete", {"vmid": 102, "snapname": "../config"}),
    # unicode digits and non-integers where a vmid is expected
    ("get_guest_status", {"vmid": "100"}),
    ("get_guest_status", {"vmid": "\u0661\u0660\u0660"}),  # Arabic-Indic 100
    ("get_guest_status", {"vmid": "\uff11\uff10\uff10"}),  # fullwidth 100
    ("get_guest_status", {"vmid": 100.0}),
    ("get_guest_status", {"vmid": True}),
    ("get_guest_status", {"vmid": 10**12}),
    ("get_guest_status", {"vmid": 99}),
    ("get_node_capacity", {"node": "\uff50\uff56\uff45\uff11"}),  # fullwidth pve1
    # oversize values and undeclared fields
    ("snapshot_create", {"vmid": 102, "snapname": "a" * 5000}),
    ("snapshot_create", {"vmid": 102, "snapname": "s1", "description": "x" * 10000}),
    ("snapshot_create", {"vmid": 102, "snapname": "s1", "description": "one\ntwo"}),
    ("guest_config_update", {"vmid": 102, "cipassword": "hunter2"}),
    ("guest_config_update", {"vmid": 102, "args": "-fda /dev/sda"}),
    ("list_nodes", {"cluster": "x" * 1000}),
    ("list_nodes", {"command": "id"}),
]


@pytest.mark.parametrize(("name", "args"), HOSTILE, ids=[f"{h[0]}-{i}" for i, h in enumerate(HOSTILE)])
async def test_hostile_argument_is_refused_before_any_request(
    gateway: GatewayThread, env: DevEnv, sim: Any, name: str, args: dict[str, Any]
) -> None:
    sim.clear_logs()
    token = auditor(env) if gateway.components.catalog.tools[name].effect == "read" else admin(env, "e2e-hostile")
    res = await call(env, token, name, args)
    assert res.is_error, text(res)
    assert res.meta["pvegate/outcome"] == "invalid", text(res)
    assert sim.requests_log() == []
    assert sim.ssh_log() == []


def test_safe_value_rules() -> None:
    for bad in ["", "-x", "--format", "a b", "a\tb", "x;y", "$(id)", "`id`", "a|b", "a&b", "a>b", "é", "a\nb", "{x}"]:
        assert safe_value(bad) is not None, bad
    for good in ["app-db-1", "10.10.1.100", "a408927b7a65", "200"]:
        assert safe_value(good) is None, good


def test_allow_list_is_exactly_the_declared_forms() -> None:
    allow = AllowList(Catalog.load(REPO_ROOT / "connectors"))
    assert allow.match(["ping", "-c", "1", "-W", "1", "10.0.0.1"]) == "node_ping"
    assert allow.match(["ping", "-c", "1", "-W", "1", "10.0.0.1", "-f"]) is None
    assert allow.match(["ping", "-c", "1000", "-W", "1", "10.0.0.1"]) is None
    assert allow.match(["ping", "-c", "1", "-W", "1", "not-an-ip"]) is None
    assert allow.match(["pct", "exec", "200", "--", "docker", "ps", "-a", "--no-trunc", "--format", "{{json .}}"]) == (
        "lxc_docker_ps"
    )
    env_template = ["pct", "exec", "200", "--", "docker", "inspect", "--format", "{{json .Config.Env}}", "app-db-1"]
    assert allow.match(env_template) is None
    assert allow.match(["pct", "exec", "200", "--", "sh", "-c", "id"]) is None
    assert allow.match(["qm", "list"]) == "node_qm_list"
    assert allow.match(["qm", "stop", "100"]) is None


def test_render_argv_refuses_unsafe_values_even_without_schema() -> None:
    tool = Catalog.load(REPO_ROOT / "connectors").tools["lxc_docker_inspect"]
    with pytest.raises(Refused):
        render_argv(tool, {"vmid": 200, "container": "-rf"})
    with pytest.raises(Refused):
        render_argv(tool, {"vmid": 200, "container": "a b"})
    argv = render_argv(tool, {"vmid": 200, "container": "app-db-1"})
    assert argv[2] == "200" and argv[-1] == "app-db-1" and len(argv) == len(tool.spec["argv"])


def test_render_path_keeps_each_value_one_segment() -> None:
    assert render_path("/nodes/{node}/status", {"node": "a/b"}) == "/nodes/a%2Fb/status"
    for bad in ("..", ".", ""):
        with pytest.raises(ToolError):
            render_path("/nodes/{node}/status", {"node": bad})


def test_validation_rejects_float_and_bool_vmids() -> None:
    tool = Catalog.load(REPO_ROOT / "connectors").tools["vm_start"]
    for bad in (100.0, True, "100", "\u0661\u0660\u0660"):
        with pytest.raises(ArgumentError):
            tool.validate({"vmid": bad})
    assert tool.validate({"vmid": 100}) == {"vmid": 100}


def test_ssh_runtime_refuses_before_connecting(gateway: GatewayThread, sim: Any) -> None:
    """Second line of defence: bypass the schema and call the runtime with an unsafe value."""
    sim.clear_logs()
    c = gateway.components
    tool = c.catalog.tools["node_ping"]
    assert gateway.loop is not None
    fut = asyncio.run_coroutine_threadsafe(
        c.runtime(tool).call(tool, {"node": "pve1", "ip": "-f"}, CallContext("default")), gateway.loop
    )
    with pytest.raises(Refused):
        fut.result(timeout=30)
    assert sim.ssh_log() == []
