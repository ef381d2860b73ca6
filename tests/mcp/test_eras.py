"""Both protocol eras from one endpoint, driven by the official SDK client (and raw HTTP for 2025-06-18)."""

from __future__ import annotations

import ssl

import httpx
import pytest
from mcp_types.methods import validate_server_result

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread, audit_rows


def _rid(result: object) -> str:
    return str((getattr(result, "meta", None) or {})["pvegate/request_id"])


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28", "auto"])
async def test_sdk_client_lists_and_calls_in_each_mode(gateway: GatewayThread, env: DevEnv, mode: str) -> None:
    token = env.token("demo-agent", ["operator"])
    async with mcp_client(env.url, token, env.ca_file, mode=mode) as client:
        listed = await client.list_tools()
        names = {t.name for t in listed.tools}
        assert "list_nodes" in names
        tool = next(t for t in listed.tools if t.name == "list_nodes")
        assert tool.input_schema["type"] == "object" and tool.title and tool.description
        res = await client.call_tool("list_nodes", {})
    assert not res.is_error, res.content
    assert res.structured_content["items"] and res.content[0].type == "text"
    rows = audit_rows(env.config.audit_path, _rid(res))
    protocol = '"protocol":"2026-07-28"' if mode != "legacy" else '"protocol":"2025-11-25"'
    assert protocol in rows[0]["body"]


async def test_sdk_client_sees_denial_and_invalid_arguments_as_tool_errors(gateway: GatewayThread, env: DevEnv) -> None:
    async with mcp_client(env.url, env.token("demo-stranger", []), env.ca_file, mode="2026-07-28") as client:
        denied = await client.call_tool("list_nodes", {})
    assert denied.is_error and "Denied by policy" in denied.content[0].text
    async with mcp_client(env.url, env.token("demo-agent", ["operator"]), env.ca_file) as client:
        invalid = await client.call_tool("list_nodes", {"no_such_argument": 1})
    assert invalid.is_error and "invalid argument" in invalid.content[0].text


def _http(env: DevEnv) -> httpx.Client:
    return httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30)


def test_2025_06_18_handshake_and_wire_shapes(gateway: GatewayThread, env: DevEnv) -> None:
    auth = {
        "authorization": f"Bearer {env.token('demo-agent', ['operator'])}",
        "accept": "application/json, text/event-stream",
    }
    with _http(env) as http:
        init = http.post(
            env.url,
            headers=auth,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            },
        ).json()["result"]
        assert init["protocolVersion"] == "2025-06-18"
        validate_server_result("initialize", "2025-06-18", init)
        hdrs = {**auth, "mcp-protocol-version": "2025-06-18"}
        assert (
            http.post(env.url, headers=hdrs, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code
            == 202
        )
        listed = http.post(env.url, headers=hdrs, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).json()[
            "result"
        ]
        validate_server_result("tools/list", "2025-06-18", listed)
        called = http.post(
            env.url,
            headers=hdrs,
            json={"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_nodes", "arguments": {}}},
        ).json()["result"]
        validate_server_result("tools/call", "2025-06-18", called)
        assert called["isError"] is False and isinstance(called["structuredContent"], dict)


def test_initialize_counter_offers_for_unknown_versions(gateway: GatewayThread, env: DevEnv) -> None:
    auth = {"authorization": f"Bearer {env.token('demo-agent', ['operator'])}"}
    with _http(env) as http:
        r = http.post(
            env.url,
            headers=auth,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2024-11-05",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            },
        )
    assert r.json()["result"]["protocolVersion"] == "2025-11-25"


def test_modern_results_conform_to_the_2026_wire_types(gateway: GatewayThread, env: DevEnv) -> None:
    from tests.mcp.wire import modern_post

    token = env.token("demo-agent", ["operator"])
    with _http(env) as http:
        disc = modern_post(http, env.url, token, "server/discover", {}).json()["result"]
        validate_server_result("server/discover", "2026-07-28", disc)
        assert "2026-07-28" in disc["supportedVersions"] and "2025-11-25" in disc["supportedVersions"]
        listed = modern_post(http, env.url, token, "tools/list", {}).json()["result"]
        validate_server_result("tools/list", "2026-07-28", listed)
        assert listed["cacheScope"] == "private" and listed["resultType"] == "complete"
        called = modern_post(http, env.url, token, "tools/call", {"name": "list_nodes", "arguments": {}}).json()[
            "result"
        ]
        validate_server_result("tools/call", "2026-07-28", called)
        assert (
            called["resultType"] == "complete"
            and called["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "pvegate"
        )
