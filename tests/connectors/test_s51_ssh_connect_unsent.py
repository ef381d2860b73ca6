"""An SSH tool whose connection to the node was never made is an `upstream_error`, its quota slot given back.

Before: an API request that never reached Proxmox (connection refused, the gateway's token refused) was
audited `upstream_error` and gave back its quota slot and approval, but an SSH tool whose connection
failed (port closed, a host key other than the pinned one, the gateway's key refused) was audited
`failed` and kept its slot: calls no node ever heard of used up a principal's quota, and the audit said
a call failed that was never sent. A session, and so a command, can only be opened on a connection
asyncssh returned authenticated, so such a failure provably sent nothing. A failure once the command's
session was open (here: the node ran it and it exited 255) is still `failed`, its slot spent.

Real gateway, real managed OPA with a quota of 1 per tool, the simulator's SSH nodes: one cluster as
configured, one whose SSH ports are closed, one whose pinned host keys are other keys, one whose SSH
key the nodes do not authorize.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import httpx
import pytest
import yaml

from gateway.dev.devenv import DevEnv, cluster_entry, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.support import GatewayThread, audit_rows, free_port

QUOTA = {"name": "s51-one", "tools": ["node_qm_list", "lxc_docker_ps"], "counter": "tool", "window": "1m", "limit": 1}
STOPPED_CT = 202  # a stopped container on pve2: `pct exec` runs and exits 255 ("not running")


@pytest.fixture(scope="module")
def s51env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    work = tmp_path_factory.mktemp("s51")
    policy = work / "policy"
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    data["quotas"] = [QUOTA]
    (policy / "data").mkdir(parents=True)
    (policy / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    secrets = work / "secrets"
    healthy = cluster_entry("default", sim, secrets)
    closed = cluster_entry("closed", sim, secrets)
    port = free_port()  # nothing listens on it
    for node in closed["ssh"]["nodes"].values():
        node["port"] = port
    badkey = cluster_entry("badkey", sim, secrets)
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    for node in badkey["ssh"]["nodes"].values():
        node["host_key"] = other
    badauth = cluster_entry("badauth", sim, secrets)
    stranger = secrets / "stranger-ssh-key"  # a key the nodes do not authorize
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    stranger.chmod(0o600)
    badauth["ssh"]["key_file"] = str(stranger)
    clusters = [healthy, closed, badkey, badauth]
    return make_env(work, {}, port=free_port(), opa=opa, extra={"clusters": clusters})


@pytest.fixture(scope="module")
def s51gw(s51env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(s51env.config).start()
    yield gw
    gw.stop()


async def call(env: DevEnv, who: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"Authorization": f"Bearer {env.token(who, ['operator'])}", "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(verify=ctx, timeout=60.0) as http:
        r = await http.post(env.url, json=body, headers=headers)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def text(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result["content"])


def audited(env: DevEnv, result: dict[str, Any]) -> list[tuple[str, str | None, dict[str, Any]]]:
    rid = result["_meta"]["pvegate/request_id"]
    return [(r["kind"], r["outcome"], json.loads(r["body"])) for r in audit_rows(env.config.audit_path, rid)]


def used(gw: GatewayThread, who: str, tool: str) -> int:
    assert gw.loop is not None

    async def counts() -> dict[str, dict[str, int]]:
        return gw.components.usage.counts(who, tool)  # type: ignore[attr-defined,no-any-return]

    return asyncio.run_coroutine_threadsafe(counts(), gw.loop).result(timeout=30)["tool"]["1m"]


def upstream_errors(gw: GatewayThread, cluster: str, reason: str) -> float:
    got = gw.components.metrics.registry.get_sample_value(
        "pvegate_upstream_errors_total", {"cluster": cluster, "kind": "ssh", "reason": reason}
    )
    return got or 0.0


def secrets_of(env: DevEnv, sim: Any) -> list[str]:
    """The gateway's SSH private keys (each line of their body) and the API token: in no reply, no audit row."""
    lines: list[str] = []
    for cl in env.config.clusters.values():
        assert cl.ssh is not None
        lines += [ln for ln in Path(cl.ssh.key_file).read_text().splitlines() if ln and not ln.startswith("-----")]
    return lines + [str(t) for t in sim.tokens.values()]


async def test_a_connection_never_made_is_an_upstream_error_and_spends_no_quota(
    s51gw: GatewayThread, s51env: DevEnv, sim: Any
) -> None:
    who = "s51-unsent"
    sim.clear_logs()
    expected = {
        "closed": ("SSH to node pve1 failed (ConnectionRefusedError): connection refused at 127.0.0.1:", "unreachable"),
        "badkey": ("SSH host key of node pve1 does not match the pinned key", "host_key"),
        "badauth": ("SSH to node pve1 failed (PermissionDenied): the node refused the gateway's SSH key", "auth"),
    }
    for cluster, (why, reason) in expected.items():
        before = upstream_errors(s51gw, cluster, reason)
        # twice each within a quota of 1: allowed every time, as nothing was spent
        for _ in range(2):
            res = await call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": cluster})
            rows = audited(s51env, res)
            kinds = [(k, o) for k, o, _ in rows]
            assert kinds == [("received", None), ("decision", "allow"), ("result", "upstream_error")], (kinds, res)
            assert res["isError"] is True and why in text(res) and "nothing was sent" in text(res), res
            assert why in rows[-1][2]["error"]
            for secret in secrets_of(s51env, sim):
                assert secret not in json.dumps(res) and secret not in json.dumps([r[2] for r in rows])
        assert upstream_errors(s51gw, cluster, reason) == before + 2
    assert used(s51gw, who, "node_qm_list") == 0
    assert sim.ssh_log() == []  # no command reached any node

    # the quota is live: the one call the node ran spends it, the next is refused
    ok = await call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": "default"})
    assert ok["isError"] is False, text(ok)
    assert used(s51gw, who, "node_qm_list") == 1
    over = await call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": "default"})
    assert over["isError"] is True and "quota.exceeded" in over["structuredContent"]["codes"], over


async def test_a_failure_after_the_command_started_stays_failed(s51gw: GatewayThread, s51env: DevEnv, sim: Any) -> None:
    who = "s51-started"
    sim.clear_logs()
    res = await call(s51env, who, "lxc_docker_ps", {"vmid": STOPPED_CT, "cluster": "default"})
    assert res["isError"] is True and "not running" in text(res), res
    rows = audited(s51env, res)
    kinds = [(k, o) for k, o, _ in rows]
    assert kinds == [("received", None), ("decision", "allow"), ("dispatch", "started"), ("result", "failed")], kinds
    assert any(e.get("exit_status") == 255 for e in sim.ssh_log()), sim.ssh_log()  # the node ran it
    assert used(s51gw, who, "lxc_docker_ps") == 1  # spent: the command ran
    again = await call(s51env, who, "lxc_docker_ps", {"vmid": STOPPED_CT, "cluster": "default"})
    assert again["isError"] is True and "quota.exceeded" in again["structuredContent"]["codes"], again
