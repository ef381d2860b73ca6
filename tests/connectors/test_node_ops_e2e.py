"""Node operations end to end (issue #19): SDK client -> HTTPS -> JWT -> real OPA ->
pve_api/composite runtime -> simulator, with the example organisation's policy.

A simulator and gateway of this module's own: rebooting and shutting down nodes takes
their guests down, which the session's shared simulator must not see. Each mutation runs
as a human admin and must send exactly the request its YAML declares; node reboot and
shutdown are critical in the default policy (two approvers), so they are proved held and
unsent, then run through the gateway's runtime object.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from tests.connectors.test_provision_e2e import admin, answered, call, read, run, text
from tests.support import GatewayThread, free_port

NODE_TOOLS = {
    "node_apt_updates", "node_apt_refresh", "node_apt_versions", "node_apt_changelog", "node_apt_repositories",
    "node_upgrade_preflight", "node_service_status", "node_service_restart", "node_reboot", "node_shutdown",
    "node_syslog", "node_journal", "node_rrd", "guest_rrd", "node_network_iface", "node_network_pending",
    "node_network_revert", "node_time", "node_hosts",
}  # fmt: skip
API = "/api2/json/nodes"
Check = Callable[[dict[str, Any]], bool]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("sim-nodeops"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(Path(tmp_path_factory.mktemp("gw-nodeops")), {"default": sim}, port=free_port())


@pytest.fixture(scope="module")
def gateway(env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(env.config).start()
    yield gw
    gw.stop()


def items(s: dict[str, Any]) -> list[dict[str, Any]]:
    return list(s["items"])


READS: list[tuple[str, dict[str, Any], Check]] = [
    ("node_apt_versions", {"node": "pve1"}, lambda s: any(r["Package"] == "pve-manager" for r in items(s))),
    ("node_apt_repositories", {"node": "pve1"}, lambda s: s["errors"] == [] and len(s["files"]) == 2),
    ("node_service_status", {"node": "pve1", "service": "pvedaemon"}, lambda s: s["state"] == "running"),
    ("node_time", {"node": "pve1"}, lambda s: abs(s["time"] - time.time()) < 60 and s["timezone"] == "Etc/UTC"),
    ("node_hosts", {"node": "pve2"}, lambda s: "10.10.0.11 pve1.lab.internal pve1" in s["data"]),
    ("node_network_iface", {"node": "pve1", "iface": "vmbr0"}, lambda s: s["type"] == "bridge"),
    ("node_rrd", {"node": "pve1", "timeframe": "hour"},
     lambda s: len(items(s)) == 70 and items(s)[1]["time"] - items(s)[0]["time"] == 60 and items(s)[0]["maxcpu"] == 16),
    ("node_rrd", {"node": "pve2", "timeframe": "week", "cf": "MAX"},
     lambda s: items(s)[1]["time"] - items(s)[0]["time"] == 10800),
    ("guest_rrd", {"vmid": 100, "timeframe": "day"},
     lambda s: len(items(s)) == 70 and all(r["maxmem"] == 4096 << 20 and r["cpu"] > 0 for r in items(s))),
    ("guest_rrd", {"vmid": 202, "timeframe": "hour"}, lambda s: all(r["cpu"] == 0 for r in items(s))),  # stopped
    ("node_syslog", {"node": "pve1", "limit": 5}, lambda s: len(items(s)) == 5 and items(s)[0]["n"] == 1),
    ("node_syslog", {"node": "pve1", "service": "corosync", "limit": 500},
     lambda s: items(s) and all("corosync" in r["t"] for r in items(s))),
    ("node_journal", {"node": "pve1", "lastentries": 7},
     lambda s: len(s["lines"]) == 9 and s["lines"][0].startswith("s=") and "pve1" in s["lines"][1]),
    ("node_apt_changelog", {"node": "pve1", "name": "pve-manager"}, lambda s: "pve-manager (8.4.5)" in s["changelog"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "check"), READS, ids=[f"{r[0]}-{i}" for i, r in enumerate(READS)])
async def test_node_reads(gateway: GatewayThread, env: DevEnv, name: str, args: dict[str, Any], check: Check) -> None:
    s = await read(env, name, args)
    assert check(s), s


async def test_log_reads_are_bounded(gateway: GatewayThread, env: DevEnv) -> None:
    for name, args in [("node_syslog", {"node": "pve1", "limit": 501}), ("node_journal", {"node": "pve1"}),
                       ("node_journal", {"node": "pve1", "lastentries": 100000})]:  # fmt: skip
        res = await call(env, admin(env), name, args)
        assert res.is_error, (name, args)
    res = await call(env, admin(env), "node_syslog", {"node": "pve1", "since": "2026-01-01; rm -rf /"})
    assert res.is_error and "since" in text(res)


async def test_apt_refresh_shows_new_updates_and_preflight(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    before = {r["Package"] for r in (await read(env, "node_apt_updates", {"node": "pve1"}))["items"]}
    assert before == {"pve-manager", "libpve-common-perl"}
    pre = await read(env, "node_upgrade_preflight", {"node": "pve1"})
    assert pre["ready"] is True and pre["updates"] == 2 and pre["reboot_required"] is False
    assert {g["vmid"] for g in pre["running_guests"]} == {100, 101, 200} and pre["ha_managed_guests"] == [100]
    assert all(c["ran"] for c in pre["checks"])

    await run(gateway, env, sim, "node_apt_refresh", {"node": "pve1"}, ("POST", f"{API}/pve1/apt/update", {}))
    after = {r["Package"]: r for r in (await read(env, "node_apt_updates", {"node": "pve1"}))["items"]}
    assert (
        "proxmox-kernel-6.8.12-9-pve-signed" in after
        and "OldVersion" not in after["proxmox-kernel-6.8.12-9-pve-signed"]
    )
    assert after["pve-manager"]["OldVersion"] == "8.4.1"
    pre = await read(env, "node_upgrade_preflight", {"node": "pve1"})
    assert pre["updates"] == 4 and pre["reboot_required"] is True
    assert pre["kernel_updates"] == ["proxmox-kernel-6.8.12-9-pve-signed"]
    # pve2 was not refreshed: its cache is its own
    assert len((await read(env, "node_apt_updates", {"node": "pve2"}))["items"]) == 2


async def test_preflight_is_not_ready_when_a_check_cannot_run(gateway: GatewayThread, env: DevEnv) -> None:
    res = await call(env, admin(env), "node_upgrade_preflight", {"node": "pve3"})  # offline
    s = res.structured_content
    assert not res.is_error and s["ready"] is False and s["blockers"]
    assert {c["check"] for c in s["checks"] if not c["ran"]} >= {"updates", "repositories", "root_filesystem"}


async def test_service_restart(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    await run(
        gateway, env, sim, "node_service_restart", {"node": "pve2", "service": "pveproxy"},
        ("POST", f"{API}/pve2/services/pveproxy/restart", {}),
    )  # fmt: skip
    log = (await read(env, "node_syslog", {"node": "pve2", "service": "pveproxy", "limit": 500}))["items"]
    assert "Started pveproxy.service" in log[-1]["t"]
    assert (await read(env, "node_service_status", {"node": "pve2", "service": "pveproxy"}))["state"] == "running"
    # a unit that is not installed: PVE's task fails, and so does the tool
    res = await answered(env, "node_service_restart", {"node": "pve2", "service": "systemd-timesyncd"})
    assert res.is_error and "exit code 5" in text(res)


async def test_pending_network_changes_and_revert(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    s = await read(env, "node_network_pending", {"node": "pve2"})
    assert "vmbr1" in {r["iface"] for r in s["items"]} and "+iface vmbr1 inet static" in s["changes"]
    assert (await read(env, "node_network_pending", {"node": "pve1"}))["changes"] is None
    assert (await read(env, "node_network_iface", {"node": "pve2", "iface": "vmbr1"}))["cidr"] == "10.10.5.12/24"
    await run(gateway, env, sim, "node_network_revert", {"node": "pve2"}, ("DELETE", f"{API}/pve2/network", None))
    s = await read(env, "node_network_pending", {"node": "pve2"})
    assert s["changes"] is None and "vmbr1" not in {r["iface"] for r in s["items"]}
    res = await call(env, admin(env), "node_network_iface", {"node": "pve2", "iface": "vmbr1"})
    assert res.is_error and "does not exist" in text(res)


async def _guest_status(env: DevEnv) -> dict[int, str]:
    return {g["vmid"]: g["status"] for g in (await read(env, "list_guests", {}))["items"]}


async def test_node_reboot_and_shutdown_need_four_eyes(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    held = await call(env, admin(env), "node_reboot", {"node": "pve2"})
    assert held.is_error and held.structured_content["approval"]["min_approvals"] == 2, text(held)
    assert "node-power" in text(held) or held.structured_content["approval"]["codes"], text(held)
    # the simulated boot takes 3 task durations: 6 s here, so the down-time checks below cannot
    # miss it on a loaded machine (with the 1 s default a slow approval round outlived the reboot)
    sim.set_faults(task_seconds=2.0)
    try:
        verdict = await run(
            gateway, env, sim, "node_reboot", {"node": "pve2"}, ("POST", f"{API}/pve2/status", {"command": "reboot"})
        )
        assert verdict == "held"
        gateway.components.targets.invalidate("default")
        assert (await _guest_status(env))[201] == "unknown"  # the node is down: PVE cannot say
        res = await call(env, admin(env), "node_time", {"node": "pve2"})
        assert res.is_error  # unreachable while it reboots
        deadline = time.monotonic() + 60
        while (await call(env, admin(env), "node_time", {"node": "pve2"})).is_error:  # back after its boot
            if time.monotonic() > deadline:
                pytest.fail("pve2 did not come back after its reboot")
            await asyncio.sleep(0.2)
    finally:
        sim.set_faults(task_seconds=None)
    gateway.components.targets.invalidate("default")
    assert (await _guest_status(env))[202] == "running"  # stopped before, but marked start at boot (onboot=1)

    verdict = await run(
        gateway, env, sim, "node_shutdown", {"node": "pve1"}, ("POST", f"{API}/pve1/status", {"command": "shutdown"})
    )
    assert verdict == "held"
    gateway.components.targets.invalidate("default")
    await asyncio.sleep(1.5)
    nodes = {n["node"]: n["status"] for n in (await read(env, "list_nodes", {}))["items"]}
    assert nodes["pve1"] == "offline" and nodes["pve2"] == "online"  # a shutdown stays down
