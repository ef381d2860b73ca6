"""A notification naming an unsupported MCP-Protocol-Version is refused (400), as a request naming it is.

What was wrong: in the handshake era a notification was answered 202 before the version was looked at,
so `MCP-Protocol-Version: 2024-11-05` (a handshake revision pvegate does not speak) was accepted on a
notification while the same header on a request got 400 "Unsupported protocol version", and a
2026-07-28-era notification with an unsupported version got 400 too. The spec: a server that receives
an unsupported MCP-Protocol-Version MUST answer 400 Bad Request; a client must not be told a message in
a revision we do not speak was accepted.
"""

from __future__ import annotations

import ssl

import httpx

from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread, audit_rows


def _post(env: DevEnv, body: dict[str, object], version: str) -> httpx.Response:
    headers = {
        "authorization": f"Bearer {env.token('demo-agent', ['operator'])}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": version,
    }
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as http:
        return http.post(env.url, json=body, headers=headers)


def test_s49_notification_with_an_unsupported_handshake_version_is_400(gateway: GatewayThread, env: DevEnv) -> None:
    before = len(audit_rows(env.config.audit_path))
    r = _post(env, {"jsonrpc": "2.0", "method": "notifications/initialized"}, "2024-11-05")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert r.json()["id"] is None and error["code"] == -32600 and "Unsupported protocol version" in error["message"]
    assert any(row["kind"] == "refusal" for row in audit_rows(env.config.audit_path)[before:])


def test_s49_notification_with_a_supported_version_is_still_202(gateway: GatewayThread, env: DevEnv) -> None:
    r = _post(env, {"jsonrpc": "2.0", "method": "notifications/initialized"}, "2025-11-25")
    assert r.status_code == 202 and r.content == b""
