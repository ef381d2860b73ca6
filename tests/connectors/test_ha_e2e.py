"""HA family end to end on both PVE lines: one gateway in front of a PVE 8.4 cluster (`default`,
the small scenario) and a PVE 9.1 one (`beta`, the second scenario), real OPA, the example
organisation's policy.

HA groups exist on 8.x, HA rules on 9.x (PVE 9 migrated groups to rules): each tool runs on
the cluster whose release it declares, and the gateway refuses it, with nothing sent, on the
other one, and when the cluster's release cannot be learned. Every mutation must send exactly
the request its YAML declares; calls the policy holds are proved unsent, then run through the
gateway's runtime object. The shared small scenario is left as found.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.runtimes.base import CallContext
from tests.connectors.test_provision_e2e import admin, call, sent, text
from tests.support import GatewayThread, audit_rows, free_port

HA_TOOLS = {
    "ha_group_create",
    "ha_group_delete",
    "ha_group_update",
    "ha_manager_status",
    "ha_migrate",
    "ha_relocate",
    "ha_resource_add",
    "ha_resource_get",
    "ha_resource_group_set",
    "ha_resource_remove",
    "ha_resource_update",
    "ha_rule_create",
    "ha_rule_delete",
    "ha_rule_update",
    "ha_rules",
}
HA = "/api2/json/cluster/ha"


@pytest.fixture(scope="module")
def beta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    h = start_simulator("second", tmp_path_factory.mktemp("ha-beta"), ssh=False)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def two(sim: Any, beta: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayThread, DevEnv]]:
    env = make_env(tmp_path_factory.mktemp("ha-gw"), {"default": sim, "beta": beta}, port=free_port())
    gw = GatewayThread(env.config).start()
    yield gw, env
    gw.stop()


async def run_on(
    two: tuple[GatewayThread, DevEnv], simh: Any, name: str, args: dict[str, Any], want: tuple[str, str, Any]
) -> str:
    """As test_provision_e2e.run, on the cluster the arguments name: the policy's verdict for an
    admin, nothing sent when held or denied, then the connector through the runtime."""
    gw, env = two
    simh.clear_logs()
    res = await call(env, admin(env), name, args)
    verdict = "allowed"
    if res.is_error:
        assert "approval" in text(res) or "Denied" in text(res), f"{name}: {text(res)}"
        assert sent(simh) == [], f"{name} was held or denied but sent {sent(simh)}"
        verdict = "held" if "approval" in text(res) else "denied"
        await runtime(gw, name, args)
    assert sent(simh) == [want], f"{name}: {sent(simh)}"
    return verdict


async def runtime(gw: GatewayThread, name: str, args: dict[str, Any]) -> Any:
    c = gw.components
    tool = c.catalog.get(name)
    assert tool is not None and gw.loop is not None
    cluster = str(args.get("cluster", "default"))
    work = c.runtime(tool).call(tool, tool.validate(args), CallContext(cluster))
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, gw.loop))


async def direct_error(gw: GatewayThread, name: str, args: dict[str, Any]) -> str:
    try:
        await runtime(gw, name, args)
    except Exception as exc:
        return str(exc)
    raise AssertionError(f"{name} did not fail")


async def data(env: DevEnv, name: str, args: dict[str, Any]) -> Any:
    res = await call(env, admin(env), name, args)
    assert not res.is_error, text(res)
    return res.structured_content


def refusal(env: DevEnv, res: Any) -> dict[str, Any]:
    rid = res.meta["pvegate/request_id"]
    rows = audit_rows(env.config.audit_path, rid)
    assert [r["kind"] for r in rows] == ["refusal"], rows  # refused before the policy was asked
    return rows[0]


async def test_unknown_release_fails_closed(two: tuple[GatewayThread, DevEnv], beta: Any) -> None:
    """The first call to beta: its /version fails, so a version-bound tool is refused, nothing
    sent; the failure is not cached, the next call learns the release and runs."""
    _, env = two
    beta.set_faults(error_rate=1.0, error_status=500, error_path="^/version$")
    try:
        beta.clear_logs()
        res = await call(env, admin(env), "ha_rules", {"cluster": "beta"})
    finally:
        beta.set_faults(error_rate=0.0, error_path=None)
    assert res.is_error and "version of cluster beta is not known" in text(res)
    assert {e["path"] for e in beta.requests_log()} == {"/api2/json/version"}  # nothing but the lookup
    assert refusal(env, res)["outcome"] == "version_unknown"
    res = await call(env, admin(env), "ha_rules", {"cluster": "beta"})
    assert not res.is_error, text(res)


async def test_version_bound_tools_are_refused_on_the_other_release(
    two: tuple[GatewayThread, DevEnv], sim: Any, beta: Any
) -> None:
    _, env = two
    sim.clear_logs()
    res = await call(env, admin(env), "ha_rules", {})
    assert res.is_error and "works on PVE 9 and later only; cluster default runs PVE 8.4" in text(res)
    assert refusal(env, res)["outcome"] == "unsupported_version"
    dry = await call_meta(env, "ha_rule_delete", {"rule": "xx"}, {"dry_run": True})
    assert dry.is_error and "works on PVE 9 and later only" in text(dry)
    assert not any("/ha/" in e["path"] for e in sim.requests_log())
    beta.clear_logs()
    res = await call(env, admin(env), "ha_group_create", {"cluster": "beta", "group": "g1", "nodes": "edge1"})
    assert res.is_error and "works on PVE 8 and earlier only; cluster beta runs PVE 9.1" in text(res)
    assert sent(beta) == []
    # past the gateway, the 9.1 simulator answers as PVE 9 does after the migration
    why = await direct_error(two[0], "ha_group_create", {"cluster": "beta", "group": "g1", "nodes": "edge1"})
    assert "ha groups have been migrated to rules" in why


async def test_resources_groups_and_moves_on_pve8(two: tuple[GatewayThread, DevEnv], sim: Any) -> None:
    gw, env = two
    status = await data(env, "ha_manager_status", {})
    assert status["manager_status"]["master_node"] == "pve1" and "vm:100" in status["manager_status"]["service_status"]

    await run_on(
        two, sim, "ha_resource_add", {"sid": 103, "state": "started", "max_restart": 2, "comment": "ha e2e"},
        ("POST", f"{HA}/resources", {"sid": "103", "state": "started", "max_restart": "2", "comment": "ha e2e"}),
    )  # fmt: skip
    got = await data(env, "ha_resource_get", {"sid": 103})
    assert (got["sid"], got["state"], got["max_restart"]) == ("vm:103", "started", 2)
    assert "already defined" in await direct_error(gw, "ha_resource_add", {"sid": 103})

    await run_on(
        two, sim, "ha_group_create", {"group": "prefer_pve2", "nodes": "pve2:2,pve3:1", "restricted": False},
        ("POST", f"{HA}/groups", {"group": "prefer_pve2", "nodes": "pve2:2,pve3:1", "restricted": "0"}),
    )  # fmt: skip
    await run_on(
        two, sim, "ha_group_update", {"group": "prefer_pve2", "nofailback": True},
        ("PUT", f"{HA}/groups/prefer_pve2", {"nofailback": "1"}),
    )  # fmt: skip
    groups = {g["group"]: g for g in (await data(env, "list_ha_groups", {}))["items"]}
    assert groups["prefer_pve2"]["nofailback"] == 1
    await run_on(
        two, sim, "ha_resource_group_set", {"sid": 103, "group": "prefer_pve2"},
        ("PUT", f"{HA}/resources/103", {"group": "prefer_pve2"}),
    )  # fmt: skip
    assert (await data(env, "ha_resource_get", {"sid": 103}))["group"] == "prefer_pve2"
    assert "is used by service 'vm:103'" in await direct_error(gw, "ha_group_delete", {"group": "prefer_pve2"})

    await run_on(
        two, sim, "ha_resource_update", {"sid": 103, "state": "stopped"},
        ("PUT", f"{HA}/resources/103", {"state": "stopped"}),
    )  # fmt: skip
    guests = {g["vmid"]: g for g in (await data(env, "list_guests", {}))["items"]}
    assert guests[103]["status"] == "stopped"  # the HA manager enforces the requested state
    await run_on(
        two, sim, "ha_resource_update", {"sid": 103, "state": "started"},
        ("PUT", f"{HA}/resources/103", {"state": "started"}),
    )  # fmt: skip
    await run_on(
        two, sim, "ha_migrate", {"sid": 103, "target_node": "pve1"},
        ("POST", f"{HA}/resources/103/migrate", {"node": "pve1"}),
    )  # fmt: skip
    guests = {g["vmid"]: g for g in (await data(env, "list_guests", {}))["items"]}
    assert (guests[103]["node"], guests[103]["status"]) == ("pve1", "running")
    await run_on(
        two, sim, "ha_relocate", {"sid": 103, "target_node": "pve2"},
        ("POST", f"{HA}/resources/103/relocate", {"node": "pve2"}),
    )  # fmt: skip
    assert "no such node" in await direct_error(gw, "ha_migrate", {"sid": 103, "target_node": "nowhere"})

    await run_on(two, sim, "ha_resource_remove", {"sid": 103}, ("DELETE", f"{HA}/resources/103", None))
    assert "not HA managed" in await direct_error(gw, "ha_resource_remove", {"sid": 103})
    await run_on(two, sim, "ha_group_delete", {"group": "prefer_pve2"}, ("DELETE", f"{HA}/groups/prefer_pve2", None))
    guests = {g["vmid"]: g for g in (await data(env, "list_guests", {}))["items"]}
    assert guests[103]["node"] == "pve2" and not guests[103].get("hastate")


async def test_rules_on_pve9(two: tuple[GatewayThread, DevEnv], beta: Any) -> None:
    gw, env = two
    b = {"cluster": "beta"}
    await run_on(two, beta, "ha_resource_add", {**b, "sid": 102}, ("POST", f"{HA}/resources", {"sid": "102"}))
    await run_on(two, beta, "ha_resource_add", {**b, "sid": 202}, ("POST", f"{HA}/resources", {"sid": "202"}))
    assert (await data(env, "ha_resource_get", {**b, "sid": 202}))["sid"] == "ct:202"

    apart = {"rule": "keep_apart", "type": "resource-affinity", "resources": "vm:102,ct:202", "affinity": "negative"}
    await run_on(
        two, beta, "ha_rule_create", {**b, **apart},
        ("POST", f"{HA}/rules", {k: str(v) for k, v in apart.items()}),
    )  # fmt: skip
    pin = {"rule": "on_edge3", "type": "node-affinity", "resources": "vm:102", "nodes": "edge3:2,edge2:1"}
    await run_on(
        two, beta, "ha_rule_create", {**b, **pin, "strict": True},
        ("POST", f"{HA}/rules", {**pin, "strict": "1"}),
    )  # fmt: skip
    lonely = {**b, "rule": "lonely", "type": "resource-affinity", "resources": "vm:102", "affinity": "positive"}
    assert "at least two resources" in await direct_error(gw, "ha_rule_create", lonely)
    rules = {r["rule"]: r for r in (await data(env, "ha_rules", b))["items"]}
    assert set(rules) == {"keep_apart", "on_edge3"} and rules["on_edge3"]["strict"] == 1
    only = (await data(env, "ha_rules", {**b, "type": "node-affinity"}))["items"]
    assert [r["rule"] for r in only] == ["on_edge3"]

    await run_on(
        two, beta, "ha_rule_update", {**b, "rule": "keep_apart", "type": "resource-affinity", "comment": "spread"},
        ("PUT", f"{HA}/rules/keep_apart", {"type": "resource-affinity", "comment": "spread"}),
    )  # fmt: skip
    changed = {"rule": "keep_apart", "type": "node-affinity", "nodes": "edge1"}
    assert "cannot change the type" in await direct_error(gw, "ha_rule_update", {**b, **changed})
    await run_on(two, beta, "ha_rule_delete", {**b, "rule": "on_edge3"}, ("DELETE", f"{HA}/rules/on_edge3", None))
    await run_on(two, beta, "ha_rule_delete", {**b, "rule": "keep_apart"}, ("DELETE", f"{HA}/rules/keep_apart", None))
    assert "no such ha rule" in await direct_error(gw, "ha_rule_delete", {**b, "rule": "keep_apart"})
    await run_on(two, beta, "ha_resource_remove", {**b, "sid": 102}, ("DELETE", f"{HA}/resources/102", None))
    await run_on(two, beta, "ha_resource_remove", {**b, "sid": 202}, ("DELETE", f"{HA}/resources/202", None))
    assert (await data(env, "ha_rules", b))["items"] == []


async def call_meta(env: DevEnv, name: str, args: dict[str, Any], meta: dict[str, Any]) -> Any:
    from gateway.dev.client import mcp_client

    async with mcp_client(env.url, admin(env), env.ca_file) as client:
        return await client.call_tool(name, args, meta=meta)


def test_every_ha_tool_is_called_here() -> None:
    """HA_TOOLS (counted by test_tools_e2e) names only tools this module runs."""
    source = Path(__file__).read_text().split("HA_TOOLS = {", 1)[1].split("}", 1)[1]
    assert all(f'"{name}"' in source for name in HA_TOOLS)
