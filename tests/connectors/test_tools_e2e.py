"""Every tool end to end: SDK client → HTTPS → JWT → real OPA → connector runtime → simulator.

Reads run as an auditor (policy: reads everything); mutations as a human admin
(group pve-admins) on dev guests, so the policy allows them without approval.
Destroy tools are held for approval by the policy; they are proved through the
gateway (held, nothing sent) and then executed through the same runtime object.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.base import CallContext, ToolOutput
from tests.connectors.test_access_e2e import ACCESS_READS, ACCESS_WRITES
from tests.connectors.test_backup_e2e import BACKUP_TOOLS
from tests.connectors.test_ceph_e2e import CEPH_READS, CEPH_WRITES
from tests.connectors.test_cluster_pools_e2e import CLUSTER_TOOLS
from tests.connectors.test_firewall_e2e import FIREWALL_TOOLS
from tests.connectors.test_ha_e2e import HA_TOOLS
from tests.connectors.test_node_ops_e2e import NODE_TOOLS
from tests.connectors.test_provision_e2e import PROVISION_TOOLS
from tests.connectors.test_sdn_e2e import SDN_TOOLS
from tests.connectors.test_storage_content_e2e import STORAGE_TOOLS
from tests.connectors.test_tasks_certs_e2e import CERT_TOOLS, TASK_TOOLS
from tests.support import GatewayThread, audit_rows, database_bytes, per_module

Check = Callable[[dict[str, Any]], bool]
PLANTED = "SimPlantedSecret"


def auditor(env: DevEnv) -> str:
    return env.token("e2e-auditor", ["auditor"])


def admin(env: DevEnv, sub: str = "e2e-admin") -> str:
    return env.token(per_module(sub), [], groups=["pve-admins"], kind="human")


async def call(env: DevEnv, token: str, name: str, args: dict[str, Any], meta: dict[str, Any] | None = None) -> Any:
    async with mcp_client(env.url, token, env.ca_file) as client:
        return await client.call_tool(name, args, meta=meta) if meta else await client.call_tool(name, args)


def text(res: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in res.content)


def items(s: dict[str, Any]) -> list[dict[str, Any]]:
    return list(s["items"])


def node_rows(s: dict[str, Any]) -> set[str]:
    return {r["node"] for r in items(s)}


READS: list[tuple[str, dict[str, Any], Check]] = [
    ("list_nodes", {}, lambda s: node_rows(s) == {"pve1", "pve2", "pve3"}),
    ("get_node_capacity", {"node": "pve1"}, lambda s: s["cpu"]["cores"] == 16 and s["memory"]["total"] > 0),
    ("get_node_status", {"node": "pve1"}, lambda s: s["rootfs"]["total"] > 0 and s["pveversion"].startswith("pve-")),
    ("node_filesystems", {"node": "pve1"}, lambda s: "/" in {r["mountpoint"] for r in items(s)}),
    ("get_node_network", {"node": "pve1"}, lambda s: any(r["iface"] == "vmbr0" for r in items(s))),
    ("get_node_dns", {"node": "pve1"}, lambda s: bool(s.get("dns1") or s.get("search"))),
    ("get_node_version", {"node": "pve1"}, lambda s: s["version"].startswith("8.")),
    ("list_node_services", {"node": "pve1"}, lambda s: any(r.get("service") == "pveproxy" for r in items(s))),
    ("get_cluster_status", {}, lambda s: any(r["type"] == "cluster" for r in items(s))),
    ("get_cluster_resources", {"type": "vm"}, lambda s: {r["type"] for r in items(s)} == {"qemu", "lxc"}),
    ("get_version", {}, lambda s: s["version"].startswith("8.")),
    ("list_pools", {}, lambda s: {"prod", "lab"} <= {r["poolid"] for r in items(s)}),
    ("get_ha_status", {}, lambda s: any(r.get("sid") == "vm:100" for r in items(s))),
    ("list_ha_resources", {}, lambda s: {"vm:100", "ct:201"} <= {r["sid"] for r in items(s)}),
    ("list_ha_groups", {}, lambda s: any(r["group"] == "prefer-pve1" for r in items(s))),
    ("list_firewall_rules", {}, lambda s: len(items(s)) == 3),
    ("list_replication_jobs", {}, lambda s: isinstance(s["items"], list)),
    ("list_cluster_tasks", {}, lambda s: isinstance(s["items"], list)),
    ("get_token_permissions", {}, lambda s: "/" in s["permissions"]),
    ("list_guests", {}, lambda s: {100, 200, 9000} <= {r["vmid"] for r in items(s)}),
    ("list_guests", {"node": "pve2", "guest_type": "lxc"}, lambda s: {r["vmid"] for r in items(s)} == {201, 202}),
    ("get_guest_config", {"vmid": 100}, lambda s: s["config"]["name"] == "web01" and "cipassword" not in s["config"]),
    ("get_guest_stored_config", {"vmid": 103}, lambda s: s["networks"][0]["ip_source"] == "cloud-init"),
    ("get_guest_status", {"vmid": 200}, lambda s: s["status"] == "running" and s["name"] == "docker01"),
    ("get_guest_pending", {"vmid": 100}, lambda s: any(r["key"] == "cores" for r in items(s))),
    ("get_guest_firewall_rules", {"vmid": 100}, lambda s: isinstance(s["items"], list)),
    ("vm_agent_network", {"vmid": 100}, lambda s: "10.10.1.100" in str(s["result"])),
    ("vm_migrate_check", {"vmid": 103}, lambda s: "local_disks" in s),
    (
        "list_storage",
        {},
        lambda s: (
            bool(s["collected_at"])
            and all(r["available"] is None for r in items(s) if r["storage"] == "nas-iso")
            and all(r["available"] > 0 for r in items(s) if r["storage"] == "local")
            and any("pve3" in w for w in s["warnings"])
        ),
    ),
    ("list_storage", {"node": "pve2"}, lambda s: node_rows(s) == {"pve2"}),
    (
        "list_storage_content",
        {"node": "pve1", "storage": "local", "content": "backup"},
        lambda s: [r["vmid"] for r in items(s)] == [100],
    ),
    ("list_backup_jobs", {}, lambda s: {"backup-prod-nightly", "backup-lab-weekly"} == {r["id"] for r in items(s)}),
    ("list_not_backed_up", {}, lambda s: isinstance(s["items"], list)),
    ("list_snapshots", {"vmid": 100}, lambda s: [r["name"] for r in items(s)] == ["pre_upgrade"]),
    ("list_tasks", {"node": "pve1"}, lambda s: isinstance(s["items"], list)),
    ("list_tasks", {}, lambda s: "collected_at" in s and any("pve3" in w for w in s["warnings"])),
    ("node_arp_table", {"node": "pve1"}, lambda s: any(r["dst"] == "10.10.1.100" for r in items(s))),
    ("node_ping", {"node": "pve1", "ip": "10.10.1.100"}, lambda s: s["ok"] is True),
    ("node_ping", {"node": "pve1", "ip": "10.10.9.9"}, lambda s: s["ok"] is False),
    ("node_qm_list", {"node": "pve1"}, lambda s: {"100", "101", "9000"} <= {r["vmid"] for r in items(s)}),
    (
        "node_pct_list",
        {"node": "pve2"},
        lambda s: {r["vmid"]: r["name"] for r in items(s)} == {"201": "dns01", "202": "old-ct"},
    ),
    (
        "lxc_docker_ps",
        {"vmid": 200},
        # command lines and labels can carry secrets: projected away
        lambda s: len(items(s)) == 3 and not any({"Command", "Labels"} & set(r) for r in items(s)),
    ),
    (
        "lxc_docker_inspect",
        {"vmid": 200, "container": "app-db-1"},
        lambda s: (
            items(s)[0]["image"] == "postgres:16"
            and "Env" not in str(s)
            and "labels" not in items(s)[0]
            and "Log" not in str(s)
            and "Status" in items(s)[0]["state"]
        ),
    ),
    ("lxc_compose_ls", {"vmid": 200}, lambda s: [r["Name"] for r in items(s)] == ["app"]),
    (
        "list_backups",
        {},
        lambda s: (
            {p["vmid"]: p["newest_age_hours"] for p in s["per_guest"]}[100] == pytest.approx(20, abs=1)
            and {p["vmid"]: p["newest_age_hours"] for p in s["per_guest"]}[102] is None
        ),
    ),
    ("list_backups", {"vmid": 201}, lambda s: [p["count"] for p in s["per_guest"]] == [1]),
    ("check_ip_availability", {"ip": "10.10.1.100"}, lambda s: s["status"] == "in_use" and len(s["evidence"]) >= 2),
    # pve3 is offline in the scenario, so not every check can run: never "free"
    ("check_ip_availability", {"ip": "10.10.1.77"}, lambda s: s["status"] == "unknown" and s["evidence"] == []),
    (
        "list_guest_containers",
        {"vmid": 200},
        lambda s: (
            s["docker_available"] is True
            and {c["name"]: (c["health"], c["compose_service"]) for c in items(s)}["app-web-1"] == ("healthy", "web")
        ),
    ),
    ("list_guest_containers", {"vmid": 100}, lambda s: s["docker_available"] is None and s["items"] == []),
    ("list_guest_containers", {"vmid": 201}, lambda s: s["docker_available"] is False),
    ("list_guest_containers", {"vmid": 202}, lambda s: s["docker_available"] is None and bool(s["warnings"])),
    (
        "inspect_compose_stack",
        {"vmid": 200, "project": "app"},
        lambda s: [v["service"] for v in s["services"]] == ["db", "web", "worker"] and s["config_files"],
    ),
    (
        "guest_health_summary",
        {"vmid": 200},
        lambda s: any("app-worker-1" in c for c in s["concerns"]) and s["backups"]["count"] == 1,
    ),
    ("guest_health_summary", {"vmid": 102}, lambda s: "no backup found" in s["concerns"] and not s["healthy"]),
]


@pytest.mark.parametrize(("name", "args", "check"), READS, ids=[f"{r[0]}-{i}" for i, r in enumerate(READS)])
async def test_read_tool(gateway: GatewayThread, env: DevEnv, name: str, args: dict[str, Any], check: Check) -> None:
    res = await call(env, auditor(env), name, args)
    assert not res.is_error, text(res)
    assert check(res.structured_content), res.structured_content
    assert PLANTED not in text(res)


async def test_ceph_status_fails_clearly_without_ceph(gateway: GatewayThread, env: DevEnv) -> None:
    res = await call(env, auditor(env), "get_ceph_status", {})
    assert res.is_error and "get_ceph_status failed" in text(res) and "ceph" in text(res).lower()


async def test_docker_inspect_never_returns_env(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    for name, args in [
        ("lxc_docker_inspect", {"vmid": 200, "container": "app-worker-1"}),
        ("inspect_compose_stack", {"vmid": 200, "project": "app"}),
    ]:
        res = await call(env, auditor(env), name, args)
        assert not res.is_error and PLANTED not in text(res) and "API_TOKEN" not in text(res)
    inspects = [e["argv"] for e in sim.ssh_log() if "inspect" in (e["argv"] or [])]
    assert inspects and all(".Config.Env" not in " ".join(a) for a in inspects)


async def test_mutations_and_tasks(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    tok = admin(env)

    async def ok(name: str, args: dict[str, Any]) -> dict[str, Any]:
        res = await call(env, tok, name, args)
        assert not res.is_error, f"{name}: {text(res)}"
        return dict(res.structured_content)

    async def status(vmid: int) -> str:
        return str((await ok("get_guest_status", {"vmid": vmid}))["status"])

    started = await ok("vm_start", {"vmid": 102})
    assert started["exitstatus"] == "OK" and started["upid"].startswith("UPID:pve2:")
    assert await status(102) == "running"
    st = await call(env, auditor(env), "get_task_status", {"upid": started["upid"]})
    assert not st.is_error and st.structured_content["exitstatus"] == "OK"
    log = await call(env, auditor(env), "get_task_log", {"upid": started["upid"]})
    assert not log.is_error and log.structured_content["items"]
    await ok("vm_suspend", {"vmid": 102})
    await ok("vm_resume", {"vmid": 102})
    await ok("vm_reboot", {"vmid": 102})
    await ok("vm_shutdown", {"vmid": 102, "timeout": 30, "force_stop": True})
    assert await status(102) == "stopped"
    await ok("vm_start", {"vmid": 102})
    await ok("vm_stop", {"vmid": 102})
    assert await status(102) == "stopped"

    await ok("lxc_start", {"vmid": 202})
    assert await status(202) == "running"
    await ok("lxc_suspend", {"vmid": 202})
    await ok("lxc_resume", {"vmid": 202})
    await ok("lxc_reboot", {"vmid": 202})
    await ok("lxc_shutdown", {"vmid": 202, "timeout": 30})
    assert await status(202) == "stopped"
    await ok("lxc_start", {"vmid": 202})
    await ok("lxc_stop", {"vmid": 202})

    await ok("snapshot_create", {"vmid": 103, "snapname": "e2e_snap", "description": "from the e2e test"})
    snaps = (await ok("list_snapshots", {"vmid": 103}))["items"]
    assert "e2e_snap" in [s["name"] for s in snaps]
    await ok("backup_now", {"vmid": 103, "storage": "local", "mode": "snapshot", "notes": "e2e"})
    backups = (await ok("list_backups", {"vmid": 103}))["per_guest"]
    assert backups[0]["count"] >= 1
    await ok("guest_config_update", {"vmid": 103, "cores": 2, "description": "resized by e2e", "tags": "dev;e2e"})
    cfg = (await ok("get_guest_config", {"vmid": 103}))["config"]
    assert int(cfg["cores"]) == 2 and "e2e" in cfg["tags"]
    await ok("guest_clone", {"vmid": 9000, "newid": 150, "name": "clone-e2e", "full": True})
    assert 150 in {g["vmid"] for g in (await ok("list_guests", {}))["items"]}
    await ok("guest_migrate", {"vmid": 103, "target_node": "pve1", "online": True, "with_local_disks": True})
    moved = {g["vmid"]: g["node"] for g in (await ok("list_guests", {}))["items"]}
    assert moved[103] == "pve1"


async def test_wrong_guest_type_is_a_clear_error(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    res = await call(env, admin(env), "vm_start", {"vmid": 202})
    assert res.is_error and "container (lxc)" in text(res)
    res = await call(env, admin(env), "snapshot_create", {"vmid": 202, "snapname": "x1", "vmstate": True})
    assert res.is_error and "vmstate applies to qemu guests only" in text(res)
    assert [e for e in sim.requests_log() if e["method"] != "GET"] == []


async def test_dry_run_sends_nothing(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    res = await call(
        env, admin(env, "e2e-dry"), "guest_config_update", {"vmid": 102, "memory": 2048}, meta={"dry_run": True}
    )
    assert not res.is_error, text(res)
    s = res.structured_content
    assert s["dry_run"] is True and s["sent"] is False
    assert s["would_send"] == {
        "method": "PUT",
        "path": "/nodes/pve2/qemu/102/config",
        "query": {},
        "body": {"memory": 2048},
    }
    assert "guest 102 on node pve2" in s["expected_impact"]
    assert [e for e in sim.requests_log() if e["method"] != "GET"] == []


async def test_config_update_is_held_to_the_resource_quotas(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    """guest_config_update sets a guest's absolute size: the resource quotas cap the size the guest
    ends up with (the example's agents-guest-size: any agent's guest at most 8 cores, 16 GiB),
    a VM's cores counted times its sockets; the pool gains the growth."""
    op_agent = env.token(per_module("e2e-op-agent"), ["operator"], kind="agent")
    made = await call(
        env, admin(env), "vm_create",
        {"node": "pve1", "vmid": 186, "name": "two-sockets", "cores": 2, "sockets": 2, "memory": 32768, "pool": "lab"},
    )  # fmt: skip
    assert not made.is_error, text(made)
    sim.clear_logs()
    for args in ({"vmid": 102, "cores": 64}, {"vmid": 102, "memory": 1048576}, {"vmid": 186, "cores": 6}):
        res = await call(env, op_agent, "guest_config_update", args)
        assert res.is_error and "quota.resource_per_guest" in res.structured_content["codes"], f"{args}: {text(res)}"
        assert "agents-guest-size" in text(res) and "leaves the guest with" in text(res), text(res)
    assert [e for e in sim.requests_log() if e["method"] != "GET"] == []

    # the facts the policy decided on, read from the simulator as the gateway reads them
    c = gateway.components
    tool = c.catalog.get("guest_config_update")
    assert tool is not None

    async def facts(args: dict[str, Any]) -> dict[str, Any] | None:
        target = await c.targets.resolve(tool, args, "default")
        return await c.targets.resources(tool, tool.validate(args), "default", target)

    vm = _on_gateway_loop(gateway, facts({"vmid": 186, "cores": 6, "memory": 16384}))
    assert vm is not None and vm["pool"] == "lab" and vm["pool_usage"] is not None
    assert vm["final"] == {"cores": 12, "memory_mib": 16384}  # 6 cores on each of 2 sockets; memory shrinks
    assert vm["requested"] == {"guests": 0, "cores": 8, "memory_mib": 0, "disk_gib": 0}  # the growth over 2 x 2
    ct = _on_gateway_loop(gateway, facts({"vmid": 202, "memory": 2048}))
    assert ct is not None and ct["final"] == {"memory_mib": 2048 + 512}  # a container's swap counts as memory
    assert ct["requested"]["memory_mib"] == 1536
    tags_only = _on_gateway_loop(gateway, facts({"vmid": 186, "tags": "dev"}))
    assert tags_only is not None and tags_only["final"] == {} and set(tags_only["requested"].values()) == {0}

    # 4 cores on each of 2 sockets is 8, within the cap: sent as given (memory the call leaves alone
    # is not its to answer for)
    res = await call(env, op_agent, "guest_config_update", {"vmid": 186, "cores": 4})
    assert not res.is_error, text(res)
    assert [(e["method"], e["body"]) for e in sim.requests_log() if e["method"] != "GET"] == [("PUT", {"cores": "4"})]
    assert {g["vmid"]: g for g in (await call(env, auditor(env), "list_guests", {})).structured_content["items"]}[186][
        "maxcpu"
    ] == 8


DESTROY = [
    (
        "snapshot_delete",
        {"vmid": 102, "snapname": "d_del"},
        ("DELETE", "/api2/json/nodes/pve2/qemu/102/snapshot/d_del"),
    ),
    (
        "snapshot_rollback",
        {"vmid": 202, "snapname": "d_rb"},
        ("POST", "/api2/json/nodes/pve2/lxc/202/snapshot/d_rb/rollback"),
    ),
    ("guest_delete", {"vmid": 150, "purge": True}, ("DELETE", "/api2/json/nodes/pve1/qemu/150")),
]


def _on_gateway_loop(gw: GatewayThread, coro: Any) -> Any:
    assert gw.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(timeout=60)


@pytest.mark.parametrize(("name", "args", "sent"), DESTROY, ids=[d[0] for d in DESTROY])
async def test_destroy_tool(
    gateway: GatewayThread, env: DevEnv, sim: Any, name: str, args: dict[str, Any], sent: tuple[str, str]
) -> None:
    if name == "guest_delete":  # the clone made by test_mutations_and_tasks, or make one
        await call(env, admin(env), "guest_clone", {"vmid": 9000, "newid": 150, "name": "clone-e2e"})
    else:  # a snapshot to destroy (writes are allowed for the admin without approval)
        made = await call(env, admin(env), "snapshot_create", {"vmid": args["vmid"], "snapname": args["snapname"]})
        assert not made.is_error, text(made)
    sim.clear_logs()
    res = await call(env, admin(env, f"e2e-{name}"), name, args)
    # the policy library holds every destroy for an SRE lead's approval (or denies it outside a window)
    assert res.is_error and ("approval" in text(res) or "Denied" in text(res)), text(res)
    assert [e for e in sim.requests_log() if e["method"] != "GET"] == []
    rows = audit_rows(env.config.audit_path)
    assert any(r["tool"] == name and r["kind"] == "decision" for r in rows)
    # the connector itself, through the gateway's own runtime object
    c = gateway.components
    tool = c.catalog.get(name)
    assert tool is not None
    out: ToolOutput = _on_gateway_loop(gateway, c.runtime(tool).call(tool, tool.validate(args), CallContext("default")))
    assert out.data["exitstatus"] == "OK" and out.task_id
    assert [(e["method"], e["path"]) for e in sim.requests_log() if e["method"] != "GET"] == [sent]


async def test_partial_results_when_a_node_goes_offline(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.set_faults(offline_nodes=["pve2"])
    gateway.components.targets.invalidate("default")
    try:
        res = await call(env, auditor(env), "list_storage", {})
        s = res.structured_content
        assert not res.is_error and s["collected_at"]
        assert "pve2" not in node_rows(s) and "pve1" in node_rows(s)
        assert any("pve2" in w for w in s["warnings"])
        res = await call(env, auditor(env), "list_guest_containers", {"vmid": 201})
        assert not res.is_error and res.structured_content["docker_available"] is None
    finally:
        sim.set_faults(offline_nodes=[])
        gateway.components.targets.invalidate("default")


async def test_unknown_cluster_is_refused_and_cluster_reaches_policy(gateway: GatewayThread, env: DevEnv) -> None:
    res = await call(env, auditor(env), "list_nodes", {"cluster": "elsewhere"})
    assert res.is_error and "unknown cluster 'elsewhere'" in text(res)
    res = await call(env, auditor(env), "list_nodes", {"cluster": "default"})
    assert not res.is_error
    rid = res.meta["pvegate/request_id"]
    received = next(r for r in audit_rows(env.config.audit_path, rid) if r["kind"] == "received")
    assert '"cluster":"default"' in received["body"].replace(" ", "")


def test_no_secret_reaches_the_audit_log(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    raw = database_bytes(env.config.audit_path)
    for secret in sim.tokens.values():
        assert secret.split("=", 1)[1].encode() not in raw
    assert PLANTED.encode() not in raw


EXERCISED_ELSEWHERE = {
    *(f"{k}_{op}" for k in ("vm", "lxc") for op in ("start", "stop", "shutdown", "reboot", "suspend", "resume")),
    "snapshot_create", "backup_now", "guest_config_update", "guest_clone", "guest_migrate",
    "get_task_status", "get_task_log", "get_ceph_status",
}  # fmt: skip


def test_every_tool_has_an_end_to_end_test(gateway: GatewayThread) -> None:
    covered = {r[0] for r in READS} | {d[0] for d in DESTROY} | EXERCISED_ELSEWHERE | PROVISION_TOOLS | BACKUP_TOOLS
    covered |= FIREWALL_TOOLS | SDN_TOOLS | HA_TOOLS
    covered |= NODE_TOOLS | STORAGE_TOOLS | CLUSTER_TOOLS | TASK_TOOLS | CERT_TOOLS
    covered |= ACCESS_READS | ACCESS_WRITES | CEPH_READS | CEPH_WRITES
    assert covered == set(gateway.components.catalog.tools)
