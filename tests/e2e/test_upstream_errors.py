"""Errors that name the real cause when Proxmox cannot be asked.

Before: with Proxmox stopped or rejecting the gateway's token, a mutation answered
"Denied by policy: the target guest ... could not be resolved" and the audit kept a
policy deny; a certificate from another CA read "unreachable (ConnectError)". Now
each cause has its own wording and the audit outcome `upstream_error`, whether the
target lookup or the call itself is what failed.

One gateway, five clusters: the real simulator (healthy), the same simulator with a
wrong API token, with a CA file of another CA, with a wrong pinned fingerprint, and
a second simulator that has been stopped.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv, cluster_entry, make_env
from tests.support import GatewayThread, audit_rows, free_port

VM = 102  # a stopped dev guest on pve2: an operator may start it


@pytest.fixture(scope="module")
def dead_sim(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("deadsim"), ssh=False)
    handle.stop()  # its address is now one nothing listens on
    return handle


@pytest.fixture(scope="module")
def uenv(sim: Any, dead_sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    work = tmp_path_factory.mktemp("upstream")
    secrets = work / "secrets"
    healthy = cluster_entry("default", sim, secrets)
    badtoken = cluster_entry("badtoken", sim, secrets)
    Path(badtoken["token"]["file"]).write_text("root@pam!pvegate=00000000-0000-0000-0000-000000000000\n")
    badca = cluster_entry("badca", sim, secrets)
    other_ca = work / "other-ca.pem"  # a CA that did not sign the simulator's certificate
    badca["ca_file"] = str(other_ca)
    badpin = {**cluster_entry("badpin", sim, secrets), "fingerprint": "AB:" * 31 + "AB"}
    badpin.pop("ca_file")
    down = cluster_entry("down", dead_sim, secrets)
    for entry in (badtoken, badca, badpin, down):
        entry.pop("ssh", None)
    env = make_env(work, {}, port=free_port(), extra={"clusters": [healthy, badtoken, badca, badpin, down]})
    other_ca.write_bytes(env.ca_file.read_bytes())  # the gateway's own dev CA: valid, but not the simulator's
    return env


@pytest.fixture(scope="module")
def ugw(uenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(uenv.config).start()
    yield gw
    gw.stop()


async def call(env: DevEnv, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    token = env.token("upstream-op", ["operator"])
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(verify=ctx, timeout=60.0) as http:
        r = await http.post(env.url, json=body, headers=headers)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def text(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result["content"])


def rows(env: DevEnv, result: dict[str, Any]) -> list[tuple[str, str | None, dict[str, Any]]]:
    rid = result["_meta"]["pvegate/request_id"]
    return [(r["kind"], r["outcome"], json.loads(r["body"])) for r in audit_rows(env.config.audit_path, rid)]


CAUSES = {
    "down": "Proxmox cluster down is unreachable at 127.0.0.1:",
    "badtoken": "Proxmox rejected the gateway's API token for cluster badtoken (HTTP 401",
    "badca": "TLS verification of Proxmox cluster badca (127.0.0.1:",
    "badpin": "TLS verification of Proxmox cluster badpin failed: its certificate does not match the pinned",
}


async def test_healthy_cluster_works(ugw: GatewayThread, uenv: DevEnv) -> None:
    res = await call(uenv, "list_nodes", {"cluster": "default"})
    assert res["isError"] is False, text(res)


@pytest.mark.parametrize("cluster", sorted(CAUSES))
async def test_target_lookup_failure_is_an_upstream_error_not_a_policy_deny(
    cluster: str, ugw: GatewayThread, uenv: DevEnv, sim: Any
) -> None:
    sim.clear_logs()
    res = await call(uenv, "vm_start", {"vmid": VM, "cluster": cluster})
    assert res["isError"] is True and res["_meta"]["pvegate/outcome"] == "failed", res
    assert CAUSES[cluster] in text(res), text(res)
    assert "policy" not in text(res).lower() and "could not be resolved" not in text(res)
    if cluster == "badca":
        assert "certificate verify failed" in text(res) or "certificate" in text(res), text(res)
    audited = rows(uenv, res)
    assert [(k, o) for k, o, _ in audited] == [("refusal", "upstream_error")], audited  # no decision at all
    assert CAUSES[cluster] in audited[0][2]["error"]
    assert not [e for e in sim.requests_log() if e["method"] != "GET"]  # nothing was started


@pytest.mark.parametrize("cluster", sorted(CAUSES))
async def test_call_failure_is_an_upstream_error(cluster: str, ugw: GatewayThread, uenv: DevEnv) -> None:
    """A read with no target to look up: decided (allow), then the call names the cause."""
    res = await call(uenv, "list_nodes", {"cluster": cluster})
    assert res["isError"] is True and CAUSES[cluster] in text(res), text(res)
    audited = rows(uenv, res)
    kinds = [(k, o) for k, o, _ in audited]
    assert kinds[:2] == [("received", None), ("decision", "allow")] and kinds[-1] == ("result", "upstream_error")
    assert CAUSES[cluster] in audited[-1][2]["error"]
