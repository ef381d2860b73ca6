"""tools/list when OPA gives no answer: a JSON-RPC error saying the policy decision is unavailable,
never an empty listing. Found in review: the missing answer became an empty list, a valid answer a
client shows as "this gateway has no tools" (and, in the 2026-07-28 era, caches for ttlMs).

Real OPA throughout: an external OPA at an address where nothing listens, or the managed sidecar
stopped under a running gateway."""

from __future__ import annotations

import dataclasses
import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import build_components
from gateway.core.config import OPAConfig, SecretRef
from gateway.dev.devenv import DevEnv, make_env
from gateway.mcp.methods import POLICY_UNAVAILABLE
from gateway.mcp.stdio import local_principal
from gateway.store.outcomes import RETRY_AFTER_SECONDS
from tests.mcp.stdio_pipe import exchange
from tests.mcp.wire import modern_post
from tests.support import GatewayThread, free_port

LOCAL = {"desk-agent": {"kind": "agent", "roles": ["operator"]}}
LEGACY = {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}


def _dead_opa(tmp_path: Path) -> OPAConfig:
    token = tmp_path / "opa-token"
    token.write_text("t0ken\n")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    return OPAConfig(mode="external", url=dead, timeout_ms=300, token=SecretRef(file=token))


def _unavailable(doc: dict[str, Any], id_: Any) -> None:
    assert "result" not in doc, doc  # never a listing, empty or not (nor its ttlMs)
    assert doc["id"] == id_
    error = doc["error"]
    assert error["code"] == POLICY_UNAVAILABLE, error
    assert "policy decision unavailable" in error["message"], error
    assert error["data"]["retry_after_seconds"] == RETRY_AFTER_SECONDS
    assert "ClientConnectorError" not in json.dumps(doc)  # OPA's own words stay in the log


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_http_listing_without_opa_is_an_error(env: DevEnv, tmp_path: Path, version: str) -> None:
    cfg = dataclasses.replace(
        env.config,
        port=free_port(),
        opa=_dead_opa(tmp_path),
        audit_path=tmp_path / "audit-list-opa-down.db",
    )
    gw = GatewayThread(cfg).start()
    try:
        url = f"https://127.0.0.1:{cfg.port}/mcp"
        token = env.token("list-no-opa", ["operator"])
        headers = {
            "authorization": f"Bearer {token}",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": version,
        }
        with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as http:
            legacy = http.post(url, json=LEGACY, headers=headers)
            _unavailable(legacy.json(), 7)
            modern = modern_post(http, url, token, "tools/list", {})
            _unavailable(modern.json(), 1)
            for response in (legacy, modern):  # the gateway's failure, retryable: 503 in both eras
                assert response.status_code == 503, response.status_code
                assert response.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
        assert len(gw.components.listings) == 0  # nothing kept to answer from later
    finally:
        gw.stop()


@pytest.mark.parametrize("opa", ["unreachable", "sidecar_stopped"])
async def test_stdio_listing_without_opa_is_an_error(sim: Any, tmp_path: Path, opa: str) -> None:
    env = make_env(tmp_path / "gw", {"default": sim}, port=free_port(), extra={"local_principals": LOCAL})
    config = env.config
    if opa == "unreachable":
        config = dataclasses.replace(config, opa=_dead_opa(tmp_path))
    c = await build_components(config)
    try:
        if opa == "sidecar_stopped":
            assert c.sidecar is not None
            c.sidecar.stop()  # OPA gone under a running gateway (no supervisor here to bring it back)
        me = local_principal(config.local_principals["desk-agent"])
        # the gateway's failure is not the agent's refusal: were it counted, the budget of one would
        # turn the later listings into 429-style refusals (TOO_MANY_REQUESTS) instead of the reason
        c.principal_limits.refusals_per_window = 1
        modern_meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        }
        replies = await exchange(c, me, [
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
            ).encode(),
            json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}).encode(),
            json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": modern_meta}}).encode(),
            json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}}).encode(),
            json.dumps({"jsonrpc": "2.0", "id": 5, "method": "ping"}).encode(),
        ])  # fmt: skip
        by_id = {r["id"]: r for r in replies}
        assert by_id[1]["result"]["serverInfo"]["name"] == "pvegate"
        _unavailable(by_id[2], 2)
        _unavailable(by_id[3], 3)
        _unavailable(by_id[4], 4)
        assert by_id[5]["result"] == {}  # the session goes on
        assert len(c.listings) == 0
    finally:
        await c.close()
