"""Runtime guarantees against the real simulator: TLS pinning, host-key pinning, output cap,
clear 403s, and a token that never shows up in logs."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import socket
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import asyncssh
import pytest

from gateway.core.config import ClusterConfig, SecretRef
from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import AnswerLost, CallContext, ToolError, UpstreamError
from gateway.tools.runtimes.pve_api import PveApiClient, PveApiRuntime
from gateway.tools.runtimes.ssh import AllowList, SshRuntime
from gateway.tools.targets import TargetResolver


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


def _cluster(env: DevEnv, **changes: Any) -> ClusterConfig:
    return dataclasses.replace(env.config.clusters["default"], **changes)


def _leaf_fingerprint(api_url: str) -> str:
    u = urlsplit(api_url)
    pem = ssl.get_server_certificate((u.hostname or "", u.port or 443))
    return ":".join(f"{b:02X}" for b in hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).digest())


async def test_fingerprint_pinning(env: DevEnv, sim: Any) -> None:
    good = PveApiClient(_cluster(env, ca_file=None, fingerprint=_leaf_fingerprint(sim.api_url)))
    try:
        assert (await good.request("GET", "/version"))["version"].startswith("8.")
    finally:
        await good.close()
    bad = PveApiClient(_cluster(env, ca_file=None, fingerprint="00" * 32))
    sim.clear_logs()
    with pytest.raises(ToolError, match="does not match the pinned fingerprint"):
        await bad.request("GET", "/version")
    assert sim.requests_log() == []  # the token never went out


async def test_tls_is_verified_by_default(env: DevEnv, sim: Any) -> None:
    client = PveApiClient(_cluster(env, ca_file=None))  # system trust store: the simulator's CA is not in it
    sim.clear_logs()
    with pytest.raises(UpstreamError, match=r"TLS verification of Proxmox cluster default .* failed: .*certificate"):
        await client.request("GET", "/version")
    await client.close()
    assert sim.requests_log() == []


async def test_verify_tls_off_is_explicit_and_logged(env: DevEnv, caplog: pytest.LogCaptureFixture) -> None:
    client = PveApiClient(_cluster(env, ca_file=None, verify_tls=False))
    with caplog.at_level(logging.WARNING, logger="pvegate.pve_api"):
        assert await client.request("GET", "/version")
    await client.close()
    assert "TLS verification is OFF for cluster default" in caplog.text


async def test_403_names_the_missing_privilege(
    env: DevEnv, sim: Any, catalog: Catalog, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token_file = tmp_path / "auditor-token"
    token_file.write_text(sim.tokens["auditor"])
    client = PveApiClient(_cluster(env, token=SecretRef(file=token_file)))
    rt = PveApiRuntime({"default": client}, TargetResolver({"default": client}))
    tool = catalog.tools["vm_start"]
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ToolError) as exc:
            await rt.call(tool, {"vmid": 102}, CallContext("default"))
    await rt.close()
    assert str(exc.value) == "the gateway's Proxmox token lacks VM.PowerMgmt on /vms/102 (cluster default)"
    assert sim.tokens["auditor"].split("=", 1)[1] not in caplog.text


def _ssh_runtime(env: DevEnv, catalog: Catalog, **ssh_changes: Any) -> SshRuntime:
    cl = env.config.clusters["default"]
    assert cl.ssh is not None
    cl = dataclasses.replace(cl, ssh=dataclasses.replace(cl.ssh, **ssh_changes))
    client = PveApiClient(cl)
    return SshRuntime({"default": cl}, TargetResolver({"default": client}), AllowList(catalog))


async def test_changed_host_key_fails_closed(env: DevEnv, sim: Any, catalog: Catalog) -> None:
    cl = env.config.clusters["default"]
    assert cl.ssh is not None
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    nodes = {n: dataclasses.replace(c, host_key=other) for n, c in cl.ssh.nodes.items()}
    rt = _ssh_runtime(env, catalog, nodes=nodes)
    sim.clear_logs()
    with pytest.raises(ToolError, match="does not match the pinned key"):
        await rt.call(catalog.tools["node_qm_list"], {"node": "pve1"}, CallContext("default"))
    await rt.close()
    assert sim.ssh_log() == []


async def test_output_cap_and_pool_reuse(env: DevEnv, catalog: Catalog) -> None:
    rt = _ssh_runtime(env, catalog, max_output_bytes=64)
    with pytest.raises(ToolError, match="exceeded the 64-byte cap"):
        await rt.call(catalog.tools["node_qm_list"], {"node": "pve1"}, CallContext("default"))
    await rt.close()
    rt = _ssh_runtime(env, catalog)
    for _ in range(3):
        out = await rt.call(catalog.tools["node_pct_list"], {"node": "pve2"}, CallContext("default"))
        assert {r["vmid"] for r in out.data} >= {"201", "202"}
    assert len(rt.pool._conns) == 1  # one connection per node, reused
    await rt.close()


async def test_retries_only_for_reads(env: DevEnv, sim: Any, catalog: Catalog) -> None:
    client = PveApiClient(_cluster(env))
    rt = PveApiRuntime({"default": client}, TargetResolver({"default": client}))
    try:
        sim.set_faults(drop_rate=1.0, drop_path="^/(version|nodes/pve2/qemu/102/status/start)$")
        sim.clear_logs()
        with pytest.raises(ToolError):
            await client.request("GET", "/version")
        assert len([e for e in sim.requests_log() if e["path"].endswith("/version")]) == 3
        sim.clear_logs()
        with pytest.raises(AnswerLost):  # sent, then cut: it may have run (never "unreachable")
            await rt.call(catalog.tools["vm_start"], {"vmid": 102}, CallContext("default"))
        assert len([e for e in sim.requests_log() if e["method"] == "POST"]) == 1  # a mutation is never retried
    finally:
        sim.set_faults(drop_rate=0.0, drop_path=None)
        await rt.close()


async def test_nothing_sent_and_answer_lost_stay_apart(env: DevEnv, sim: Any) -> None:
    """The transport (aiohttp under httpx) must keep what the retry and outcome rules rest on:
    a refused connection sent nothing and says why; an answer that never came is AnswerLost."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    closed = PveApiClient(_cluster(env, api_url=f"https://127.0.0.1:{port}/api2/json"))
    with pytest.raises(UpstreamError, match=r"unreachable at 127\.0\.0\.1:\d+ \(Connection refused\)") as exc:
        await closed.request("POST", "/nodes/pve2/qemu/102/status/start")
    assert exc.value.cause == "unreachable"
    await closed.close()

    client = PveApiClient(_cluster(env, timeout=0.5))
    try:
        sim.set_faults(latency_ms=3000, latency_path="^/nodes/pve2/qemu/102/status/start$")
        sim.clear_logs()
        with pytest.raises(AnswerLost, match="did not answer in time"):
            await client.request("POST", "/nodes/pve2/qemu/102/status/start")
        assert len([e for e in sim.requests_log() if e["method"] == "POST"]) <= 1
    finally:
        sim.set_faults(latency_ms=0, latency_path=None)
        await client.close()


def test_form_and_query_encoding_match_httpx() -> None:
    """The Proxmox client left httpx for aiohttp: what PVE receives must decode to the same fields."""
    import httpx

    from gateway.tools.runtimes.transport import encode_form

    fields = {
        "net0": "virtio,bridge=vmbr0,tag=20",
        "description": "a b&c=d/é+%",
        "onboot": True,
        "force": False,
        "empty": None,
        "delete": ["ide2", "net1"],
        "cores": 4,
    }
    body = httpx.Request("POST", "https://pve.invalid/", data=fields).read().decode()
    assert encode_form(fields) == body
    assert encode_form(fields) == httpx.Request("GET", "https://pve.invalid/", params=fields).url.query.decode()
    assert parse_qsl(body, keep_blank_values=True)[1] == ("description", "a b&c=d/é+%")
