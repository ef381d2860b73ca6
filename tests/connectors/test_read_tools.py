"""The read tools as the read-only design promised them (issue #19), each from the case that exposed it.

Every test goes through the live gateway (HTTPS, JWT, real OPA, the shipped policy and data)
to the simulator. Most use the session's `small` simulator; the ones that need every node
online or a disabled storage run a second simulator on a scenario derived from `small`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv, make_env
from gateway.sim.harness import start_simulator
from gateway.sim.scenario import scenario_path
from tests.support import GatewayThread, audit_rows, database_bytes, free_port


async def call(env: DevEnv, name: str, args: dict[str, Any], sub: str = "read-auditor") -> Any:
    async with mcp_client(env.url, env.token(sub, ["auditor"]), env.ca_file) as client:
        return await client.call_tool(name, args)


def text(res: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in res.content)


async def ok(env: DevEnv, name: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await call(env, name, args)
    assert not res.is_error, text(res)
    return dict(res.structured_content)


ENV_SECRET, LXC_SECRET = "SimLeakEnv-9f8e7d", "SimLeakLxc-1a2b3c"
ARGS_SECRET = "SimLeakArgs-5c6d7e"


@pytest.fixture(scope="module")
def online_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`small` with every node online, a disabled storage and a second, VLAN-tagged NIC on VM 103."""
    raw = yaml.safe_load(scenario_path("small").read_text())
    for n in raw["nodes"]:
        n.pop("online", None)
        n.setdefault("maxcpu", 8)
    raw["storages"].append({"id": "old-nfs", "type": "nfs", "content": ["backup"], "shared": True,
                            "server": "10.10.0.70", "total_gb": 500, "used_gb": 100, "enabled": False})  # fmt: skip
    for g in raw["guests"]:
        if g["vmid"] == 103:
            g["config"] = {
                "net1": "e1000=BC:24:11:00:01:03,bridge=vmbr1,tag=20,firewall=0",
                # raw QEMU arguments: a secret object, a SPICE password, ignition data passed with fw_cfg
                "args": f"-object secret,id=s0,data={ARGS_SECRET}",
            }
        if g["vmid"] == 101:  # cloud-init asks for DHCP: only the guest agent knows the address
            g["config"] = {"ipconfig0": "ip=dhcp"}
        if g["vmid"] == 200:  # a container's environment: PVE 9 `env` (NUL-separated), raw `lxc.environment`
            g["config"] = {
                "env": f"DB_PASSWORD={ENV_SECRET}\0TZ=UTC",
                "lxc": [["lxc.environment", f"KEY={LXC_SECRET}"]],
            }
    wd = tmp_path_factory.mktemp("online-sim")
    path = wd / "online.yaml"
    path.write_text(yaml.safe_dump(raw))
    handle = start_simulator(path, wd / "run")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def online(online_sim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevEnv, Any]]:
    env = make_env(tmp_path_factory.mktemp("online-gw"), {"default": online_sim}, port=free_port())
    gw = GatewayThread(env.config).start()
    yield env, online_sim
    gw.stop()


# --- check_ip_availability ---------------------------------------------------------


async def test_ip_is_free_only_when_every_check_ran(online: tuple[DevEnv, Any]) -> None:
    env, _ = online
    s = await ok(env, "check_ip_availability", {"ip": "10.10.1.77"})
    assert s["status"] == "free" and s["reason"] is None, s
    assert all(c["complete"] for c in s["checks"])
    agents = next(c for c in s["checks"] if c["check"] == "guest_agents")
    assert agents["asked"] == 2 and agents["answered"] == 2 and agents["running_vms_without_agent"] == [103]


async def test_ip_is_unknown_when_every_guest_agent_fails(online: tuple[DevEnv, Any]) -> None:
    """The case that exposed it: all guest-agent calls answered 500, and the address was called free."""
    env, sim = online
    sim.set_faults(error_rate=1.0, error_status=500, error_path="/agent/")
    try:
        s = await ok(env, "check_ip_availability", {"ip": "10.10.1.77"})
    finally:
        sim.set_faults(error_rate=0.0, error_path=None)
    assert s["status"] == "unknown", s
    assert "guest_agents" in s["reason"]
    agents = next(c for c in s["checks"] if c["check"] == "guest_agents")
    assert agents["complete"] is False and agents["answered"] == 0 and len(agents["errors"]) == 2
    assert any("agent" in r["path"] and r["status"] == 500 for r in sim.requests_log())


@pytest.mark.parametrize(
    ("ip", "why"),
    [
        ("8.8.8.8", "outside the permitted networks (10.10.1.0/24, 10.10.2.0/24)"),
        ("10.10.1.0", "is the network address of 10.10.1.0/24"),
        ("10.10.2.255", "is the broadcast address of 10.10.2.0/24"),
        ("10.10.1.1", "is in the reserved range 10.10.1.1/32"),
        ("10.10.1.250", "is in the reserved range 10.10.1.240/28 (DHCP pool)"),
    ],
)
async def test_ip_outside_the_permitted_scope_is_refused_by_policy(
    gateway: GatewayThread, env: DevEnv, sim: Any, ip: str, why: str
) -> None:
    sim.clear_logs()
    res = await call(env, "check_ip_availability", {"ip": ip})
    assert res.is_error and why in text(res), text(res)
    assert res.structured_content["codes"] == ["guardrail.ip_scope"]
    assert sim.requests_log() == [] and sim.ssh_log() == []  # nothing was asked on its behalf
    rid = res.meta["pvegate/request_id"]
    decision = next(r for r in audit_rows(env.config.audit_path, rid) if r["kind"] == "decision")
    assert decision["outcome"] == "deny" and why in decision["body"]


# --- nodes -------------------------------------------------------------------------


async def test_list_nodes_has_root_filesystem_and_version(gateway: GatewayThread, env: DevEnv) -> None:
    s = await ok(env, "list_nodes", {})
    rows = {r["node"]: r for r in s["items"]}
    for n in ("pve1", "pve2"):
        assert rows[n]["pve_version"] == "8.4.1" and rows[n]["pveversion"].startswith("pve-manager/8.4.1/")
        fs = rows[n]["rootfs"]
        assert fs["total"] > fs["used"] > 0 and fs["available"] > 0 and 0 < fs["used_pct"] < 100
    assert rows["pve3"]["status"] == "offline" and rows["pve3"]["rootfs"] is None
    assert "offline" in rows["pve3"]["details_unavailable"]


async def test_node_capacity_lists_every_mounted_filesystem(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    s = await ok(env, "get_node_capacity", {"node": "pve1"})
    mounts = {f["mountpoint"]: f for f in s["filesystems"]}
    assert set(mounts) == {"/", "/boot/efi"}, mounts
    assert mounts["/"]["type"] == "ext4" and mounts["/"]["total"] == s["rootfs"]["total"]
    assert mounts["/boot/efi"]["used_pct"] is not None and s["cpu"]["cores"] == 16
    assert [e["argv"][0] for e in sim.ssh_log()] == ["df"]


async def test_node_capacity_says_why_filesystems_are_missing(online: tuple[DevEnv, Any]) -> None:
    env, sim = online
    s = await ok(env, "get_node_capacity", {"node": "pve2"})  # the nfs share is mounted here while active
    assert "/mnt/pve/old-nfs" not in {f["mountpoint"] for f in s["filesystems"]}  # disabled: not mounted
    sim.set_faults(offline_nodes=["pve3"])  # after the gateway's SSH session to pve3 was opened
    try:
        await ok(env, "node_ping", {"node": "pve3", "ip": "10.10.1.100"})
    except AssertionError:
        pass  # the session may or may not exist yet; either way pve3 is now unreachable
    try:
        res = await call(env, "get_node_capacity", {"node": "pve3"})
    finally:
        sim.set_faults(offline_nodes=[])
    # neither part readable: a clear failure naming both causes, no half-truth
    assert res.is_error and "node pve3: status:" in text(res) and "filesystems: SSH" in text(res), text(res)


# --- guest config ------------------------------------------------------------------


async def test_guest_config_breaks_out_network_interfaces(online: tuple[DevEnv, Any]) -> None:
    env, _ = online
    vm = await ok(env, "get_guest_config", {"vmid": 103})
    net0, net1 = vm["networks"]
    assert net0["interface"] == "net0" and net0["model"] == "virtio" and net0["bridge"] == "vmbr0"
    assert net0["firewall"] is True and net0["vlan"] is None and len(net0["mac"]) == 17
    assert (net0["ip"], net0["gateway"], net0["ip_source"]) == ("10.10.1.103/24", "10.10.1.1", "cloud-init")
    assert (net1["model"], net1["mac"], net1["bridge"], net1["vlan"], net1["firewall"]) == (
        "e1000", "BC:24:11:00:01:03", "vmbr1", 20, False,
    )  # fmt: skip
    assert net1["ip"] is None and net1["ip_source"] is None
    ct = await ok(env, "get_guest_config", {"vmid": 200})
    (eth0,) = ct["networks"]
    assert (eth0["name"], eth0["model"], eth0["ip"], eth0["gateway"], eth0["ip_source"]) == (
        "eth0", "veth", "10.10.2.200/24", "10.10.2.1", "config",
    )  # fmt: skip
    assert "cipassword" not in str(vm) and vm["agent"] is None  # no agent configured: not asked


async def test_a_containers_environment_never_leaves(online: tuple[DevEnv, Any]) -> None:
    """Proxmox returns a container's environment variables in its configuration (`env`, and raw
    `lxc.environment` lines in `lxc`): secrets, by the project's rule, like cloud-init passwords."""
    env, _ = online
    for tool in ("get_guest_config", "get_guest_stored_config", "get_guest_pending"):
        res = await call(env, tool, {"vmid": 200})
        assert not res.is_error, text(res)
        shown = json.dumps(res.structured_content) + text(res)
        assert ENV_SECRET not in shown and LXC_SECRET not in shown, (tool, shown)


async def test_a_vms_raw_qemu_arguments_never_leave(online: tuple[DevEnv, Any]) -> None:
    """`args` passes anything to kvm, secrets included (`-object secret,data=`, `-spice password=`,
    `-fw_cfg string=`): never shown, as a container's raw `lxc` lines are not."""
    env, _ = online
    for tool in ("get_guest_config", "get_guest_stored_config", "get_guest_pending"):
        res = await call(env, tool, {"vmid": 103})
        assert not res.is_error, text(res)
        shown = json.dumps(res.structured_content) + text(res)
        assert ARGS_SECRET not in shown and "-object secret" not in shown, (tool, shown)


async def test_guest_config_adds_what_the_guest_agent_knows(online: tuple[DevEnv, Any]) -> None:
    env, sim = online
    vm = await ok(env, "get_guest_config", {"vmid": 101})
    (net0,) = vm["networks"]
    assert vm["agent"] == {"answered": True, "error": None}
    assert (net0["ip"], net0["ip_source"], net0["agent_ips"][0]) == ("10.10.1.101/24", "agent", "10.10.1.101/24")
    web = await ok(env, "get_guest_config", {"vmid": 100})  # cloud-init states it; the agent confirms it
    assert web["networks"][0]["ip_source"] == "cloud-init" and "10.10.1.100/24" in web["networks"][0]["agent_ips"]
    sim.set_faults(error_rate=1.0, error_status=500, error_path="/agent/")
    try:
        res = await call(env, "get_guest_config", {"vmid": 101})
    finally:
        sim.set_faults(error_rate=0.0, error_path=None)
    s = res.structured_content
    assert not res.is_error and s["agent"]["answered"] is False and "500" in s["agent"]["error"]
    assert s["networks"][0]["ip"] is None and s["networks"][0]["ip_source"] == "dhcp"
    assert any("guest agent" in w for w in s["warnings"])


# --- storage -----------------------------------------------------------------------


async def test_storage_rolls_shared_storage_up_once_and_never_reports_zero(online: tuple[DevEnv, Any]) -> None:
    env, _ = online
    s = await ok(env, "list_storage", {})
    rows = [r for r in s["items"] if r["storage"] == "pbs"]
    assert len(rows) == 3  # per node, as Proxmox reports it
    shared = {a["storage"]: a for a in s["shared_storages"]}
    pbs = shared["pbs"]
    assert pbs["nodes"] == ["pve1", "pve2", "pve3"] and pbs["total"] == rows[0]["total"]
    assert pbs["available"] == rows[0]["available"] > 0 and pbs["space_unknown_reason"] is None
    for sid, word in (("nas-iso", "not active"), ("old-nfs", "disabled")):
        assert shared[sid]["available"] is None and word in shared[sid]["space_unknown_reason"]
        for r in (r for r in s["items"] if r["storage"] == sid):
            assert (r["total"], r["used"], r["available"]) == (None, None, None), r
            assert word in r["space_unknown_reason"]
    local = next(r for r in s["items"] if r["storage"] == "local")
    assert local["available"] > 0 and local["space_unknown_reason"] is None


# --- container tools on a VM --------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("lxc_docker_ps", {"vmid": 100}),
        ("lxc_compose_ls", {"vmid": 101}),
        ("lxc_docker_inspect", {"vmid": 100, "container": "app-web-1"}),
    ],
)
async def test_container_tools_refuse_a_vm_before_any_connection(
    gateway: GatewayThread, env: DevEnv, sim: Any, tool: str, args: dict[str, Any]
) -> None:
    sim.clear_logs()
    res = await call(env, tool, args)
    assert res.is_error and "is a VM (qemu)" in text(res) and "lxc guests only" in text(res), text(res)
    assert sim.ssh_log() == []  # no connection, no exec
    rid = res.meta["pvegate/request_id"]
    refusal = next(r for r in audit_rows(env.config.audit_path, rid) if r["kind"] == "refusal")
    assert refusal["outcome"] == "refused"


# --- audit of refused arguments -----------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "secret", "rule"),
    [
        ("node_ping", {"node": "pve1", "ip": "ghp_Zq81xK2vW9"}, "ghp_Zq81xK2vW9", "invalid argument ip: must match"),
        ("get_guest_config", {"vmid": "hunter2-SECRET"}, "hunter2-SECRET", "invalid argument vmid: must be of type"),
        ("list_storage", {"node": "pve1", "password": "s3cr3t-Val"}, "s3cr3t-Val", "password: not a parameter"),
    ],
)
async def test_refusal_names_the_argument_and_rule_never_the_value(
    gateway: GatewayThread, env: DevEnv, tool: str, args: dict[str, Any], secret: str, rule: str
) -> None:
    res = await call(env, tool, args)
    assert res.is_error and rule in text(res) and secret not in text(res), text(res)
    rid = res.meta["pvegate/request_id"]
    (refusal,) = [r for r in audit_rows(env.config.audit_path, rid) if r["kind"] == "refusal"]
    assert refusal["outcome"] == "invalid" and rule in refusal["body"]
    assert secret not in refusal["body"]
    assert secret.encode() not in database_bytes(env.config.audit_path)
