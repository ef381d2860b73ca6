"""A `tools/call` (or another request method) sent without an `id` is refused with 400, and audited.

What was wrong: such a message is a JSON-RPC notification, and every notification was answered
202 Accepted and dropped. Nothing ran (safe), but the client's mistake was never reported: a
client that left the id out believed its call accepted and waited for an answer that never came,
and no audit row showed it. The Streamable HTTP transport allows 202 only for a notification the
server accepts; input it does not accept gets an HTTP error status. Real notifications
(notifications/initialized, notifications/cancelled) keep their 202.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.mcp.wire import MODERN, modern_body, modern_headers
from tests.support import GatewayThread

WHO = "s51-no-id-agent"
CALL = {"name": "vm_stop", "arguments": {"vmid": 100}}


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as client:
        yield client


def _legacy_headers(env: DevEnv, version: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {env.token(WHO, ['operator'])}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": version,
    }


def _stops(sim: Any) -> int:
    return sum(1 for r in sim.requests_log() if r["method"] == "POST" and r["path"].endswith("/status/stop"))


def _assert_refused(env: DevEnv, r: httpx.Response, before: int, method: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    doc = r.json()
    assert doc["id"] is None and doc["error"]["code"] == -32600, doc
    assert method in doc["error"]["message"] and '"id"' in doc["error"]["message"], doc
    rows = rows_after(env.config.audit_path, before)
    assert [(row["kind"], row["outcome"], row["principal"]) for row in rows] == [("refusal", "protocol_error", WHO)]
    body = json.loads(rows[0]["body"])
    assert body["status"] == 400 and body["code"] == -32600 and method in body["reason"], body


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_s51_legacy_tools_call_without_id_is_400_and_audited(
    gateway: GatewayThread, env: DevEnv, sim: Any, http: httpx.Client, version: str
) -> None:
    before, stops = max_seq(env.config.audit_path), _stops(sim)
    r = http.post(
        env.url, json={"jsonrpc": "2.0", "method": "tools/call", "params": CALL}, headers=_legacy_headers(env, version)
    )
    _assert_refused(env, r, before, "tools/call")
    assert _stops(sim) == stops  # still nothing sent to Proxmox


@pytest.mark.parametrize("method", ["tools/list", "ping", "initialize"])
def test_s51_legacy_other_requests_without_id_are_400(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, method: str
) -> None:
    before = max_seq(env.config.audit_path)
    params = {"protocolVersion": "2025-11-25", "capabilities": {}} if method == "initialize" else {}
    r = http.post(
        env.url, json={"jsonrpc": "2.0", "method": method, "params": params}, headers=_legacy_headers(env, "2025-11-25")
    )
    _assert_refused(env, r, before, method)


def test_s51_modern_tools_call_without_id_is_400_and_audited(
    gateway: GatewayThread, env: DevEnv, sim: Any, http: httpx.Client
) -> None:
    before, stops = max_seq(env.config.audit_path), _stops(sim)
    body = modern_body("tools/call", CALL)
    del body["id"]
    r = http.post(env.url, json=body, headers=modern_headers(env.token(WHO, ["operator"]), "tools/call", "vm_stop"))
    _assert_refused(env, r, before, "tools/call")
    assert _stops(sim) == stops


@pytest.mark.parametrize("method", ["notifications/initialized", "notifications/cancelled"])
@pytest.mark.parametrize("era", ["2025-11-25", MODERN])
def test_s51_real_notifications_keep_their_202(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, method: str, era: str
) -> None:
    before = max_seq(env.config.audit_path)
    params = {"requestId": 1} if method == "notifications/cancelled" else {}
    if era == MODERN:
        headers = modern_headers(env.token(WHO, ["operator"]), method)
    else:
        headers = _legacy_headers(env, era)
    r = http.post(env.url, json={"jsonrpc": "2.0", "method": method, "params": params}, headers=headers)
    assert r.status_code == 202 and r.content == b"", (r.status_code, r.text)
    assert rows_after(env.config.audit_path, before) == []
