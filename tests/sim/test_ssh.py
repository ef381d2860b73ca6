"""SSH side: pinned host keys, key-only auth, read-only commands from the same state, logging."""

from __future__ import annotations

import json

import asyncssh
import pytest

from gateway.sim.harness import SimHandle

from .conftest import api

PINNED = (
    '{"name":{{json .Name}},"image":{{json .Config.Image}},"state":{{json .State}},'
    '"restart":{{json .HostConfig.RestartPolicy}},"ports":{{json .NetworkSettings.Ports}},'
    '"networks":{{json .NetworkSettings.Networks}},"labels":{{json .Config.Labels}}}'
)


def _known_hosts(h: SimHandle, node: str) -> asyncssh.SSHKnownHosts:
    n = h.ssh_nodes[node]
    return asyncssh.import_known_hosts(f"[{n.ssh_host}]:{n.ssh_port} {n.host_key}\n")


async def run(h: SimHandle, cmd: str, node: str = "pve1") -> asyncssh.SSHCompletedProcess:
    n = h.ssh_nodes[node]
    async with asyncssh.connect(n.ssh_host, n.ssh_port, username=h.ssh_user, client_keys=[str(h.ssh_client_key)],
                                known_hosts=_known_hosts(h, node)) as conn:  # fmt: skip
        return await conn.run(cmd, check=False)


async def test_pvesh_matches_api(simh: SimHandle) -> None:
    r = await run(simh, "pvesh get /nodes/localhost/qemu --output-format json")
    assert r.exit_status == 0
    via_ssh = json.loads(str(r.stdout))
    via_api = api(simh).data("/nodes/pve1/qemu")
    assert [g["vmid"] for g in via_ssh] == [g["vmid"] for g in via_api]
    r = await run(simh, "pvesh get /cluster/resources --type vm --output-format json")
    assert {x["id"] for x in json.loads(str(r.stdout))} == {
        x["id"] for x in api(simh).data("/cluster/resources", params={"type": "vm"})
    }
    r = await run(simh, "pvesh get /nodes/pve1/qemu/100/status/current --bogus 1 --output-format json")
    assert r.exit_status != 0 and "bogus" in str(r.stderr)


async def test_qm_and_pct_list(simh: SimHandle) -> None:
    r = await run(simh, "qm list")
    lines = str(r.stdout).splitlines()
    assert lines[0].split() == ["VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID"]
    assert lines[1].split()[:3] == ["100", "web01", "running"] and lines[1].split()[4] == "32.00"
    r = await run(simh, "pct list")
    assert str(r.stdout).splitlines()[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert "docker01" in str(r.stdout)


async def test_docker_ps_and_inspect(simh: SimHandle) -> None:
    r = await run(simh, "pct exec 200 -- docker ps --all --no-trunc --format '{{json .}}'")
    assert r.exit_status == 0
    rows = [json.loads(line) for line in str(r.stdout).splitlines()]
    assert {x["Names"] for x in rows} == {"app-web-1", "app-db-1", "app-worker-1"}
    assert all(isinstance(v, str) for x in rows for v in x.values())  # docker ps: every value is a string
    assert all(len(x["ID"]) == 64 for x in rows)
    assert "com.docker.compose.project=app" in rows[0]["Labels"]
    assert "SimPlantedSecret" not in str(r.stdout)
    r = await run(simh, "pct exec 200 -- docker ps --format '{{json .}}'")
    assert len(str(r.stdout).splitlines()) == 2  # without -a: running only
    r = await run(simh, f"pct exec 200 -- docker inspect --format '{PINNED}' app-db-1 app-web-1")
    objs = [json.loads(line) for line in str(r.stdout).splitlines()]
    assert objs[0]["name"] == "/app-db-1" and objs[0]["state"]["Health"]["Status"] == "healthy"
    assert "SimPlantedSecret" not in str(r.stdout) and "Env" not in str(r.stdout)
    # honest docker: a template that asks for the environment gets it
    r = await run(simh, "pct exec 200 -- docker inspect --format '{{json .Config.Env}}' app-db-1")
    assert "POSTGRES_PASSWORD=SimPlantedSecret-pg-7f3a9c" in str(r.stdout)
    r = await run(simh, "pct exec 200 -- docker inspect nope")
    assert r.exit_status == 1 and "No such object: nope" in str(r.stderr)
    r = await run(simh, "pct exec 200 -- docker compose ls --all --format json")
    assert json.loads(str(r.stdout))[0]["Name"] == "app"


async def test_pct_exec_failure_modes(simh: SimHandle) -> None:
    r = await run(simh, "pct exec 100 -- docker ps")  # QEMU guest: no CT config
    assert r.exit_status != 0 and "lxc/100.conf' does not exist" in str(r.stderr)
    r = await run(simh, "pct exec 202 -- docker ps", node="pve2")  # stopped CT
    assert r.exit_status != 0 and str(r.stderr) == "container '202' not running!\n"
    r = await run(simh, "pct exec 201 -- docker ps", node="pve2")  # no docker inside
    assert r.exit_status == 127


async def test_node_network_commands(simh: SimHandle) -> None:
    r = await run(simh, "ip -j neigh")
    neigh = json.loads(str(r.stdout))
    assert any(e["dst"] == "10.10.1.100" and e["state"] == ["REACHABLE"] for e in neigh)
    assert (await run(simh, "ping -c 1 -W 1 10.10.1.100")).exit_status == 0
    r = await run(simh, "ping -c 1 -W 1 10.10.9.9")
    assert r.exit_status == 1 and "100% packet loss" in str(r.stdout)


async def test_unknown_command_refused_and_logged(simh: SimHandle) -> None:
    simh.clear_logs()
    r = await run(simh, "rm -rf /tmp/x")
    assert r.exit_status == 127 and "command not found" in str(r.stderr)
    r = await run(simh, "qm stop 100")
    assert r.exit_status != 0
    log = simh.ssh_log()
    assert [e["command"] for e in log] == ["rm -rf /tmp/x", "qm stop 100"]
    assert log[0]["argv"] == ["rm", "-rf", "/tmp/x"] and log[0]["exit_status"] == 127 and log[0]["node"] == "pve1"


async def test_host_key_pinning_and_key_only_auth(simh: SimHandle) -> None:
    n = simh.ssh_nodes["pve1"]
    wrong = simh.ssh_nodes["pve2"].host_key  # another node's key must not be accepted for pve1
    kh = asyncssh.import_known_hosts(f"[{n.ssh_host}]:{n.ssh_port} {wrong}\n")
    with pytest.raises((asyncssh.HostKeyNotVerifiable, asyncssh.DisconnectError)):
        async with asyncssh.connect(n.ssh_host, n.ssh_port, username="root", client_keys=[str(simh.ssh_client_key)],
                                    known_hosts=kh):  # fmt: skip
            pass
    other = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        async with asyncssh.connect(n.ssh_host, n.ssh_port, username="root", client_keys=[other], password="x",
                                    known_hosts=_known_hosts(simh, "pve1")):  # fmt: skip
            pass
    with pytest.raises(asyncssh.PermissionDenied):
        async with asyncssh.connect(n.ssh_host, n.ssh_port, username="admin", client_keys=[str(simh.ssh_client_key)],
                                    known_hosts=_known_hosts(simh, "pve1")):  # fmt: skip
            pass


async def test_offline_node_unreachable(simh: SimHandle) -> None:
    with pytest.raises((OSError, asyncssh.Error)):
        await run(simh, "qm list", node="pve3")
