"""Protocol faults get the spec's JSON-RPC errors and HTTP statuses, never a stack trace, and are audited."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.mcp.wire import modern_body, modern_headers, modern_post
from tests.support import GatewayThread, audit_rows


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def token(env: DevEnv) -> str:
    return env.token("demo-agent", ["operator"])


def legacy_headers(token: str, version: str | None = "2025-11-25", **extra: str) -> dict[str, str]:
    h = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    if version:
        h["mcp-protocol-version"] = version
    h.update(extra)
    return h


def error_of(r: httpx.Response) -> dict[str, Any]:
    assert "Traceback" not in r.text and r.headers["content-type"].startswith("application/json"), r.text
    doc = r.json()
    assert doc["jsonrpc"] == "2.0" and "result" not in doc
    return dict(doc["error"])


PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'

LEGACY_FAULTS = [
    # (name, raw body, extra headers, status, code)
    ("parse_error", b"{not json", {}, 400, -32700),
    ("deep_nesting", b"[" * 100000, {}, 400, -32700),
    ("batch", json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]).encode(), {}, 400, -32600),
    ("not_an_object", b'"hello"', {}, 400, -32600),
    ("wrong_jsonrpc", json.dumps({"jsonrpc": "1.0", "id": 1, "method": "tools/list"}).encode(), {}, 400, -32600),
    ("method_not_string", json.dumps({"jsonrpc": "2.0", "id": 1, "method": 5}).encode(), {}, 400, -32600),
    ("bool_id", json.dumps({"jsonrpc": "2.0", "id": True, "method": "tools/list"}).encode(), {}, 400, -32600),
    ("posted_response", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {}}).encode(), {}, 400, -32600),
    (
        "params_array",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}).encode(),
        {},
        200,
        -32602,
    ),
    ("unknown_method", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}).encode(), {}, 200, -32601),
    (
        "unknown_tool",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "rm_rf"}}).encode(),
        {},
        200,
        -32602,
    ),
    (
        "no_tool_name",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}).encode(),
        {},
        200,
        -32602,
    ),
    (
        "old_version",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode(),
        {"mcp-protocol-version": "2024-11-05"},
        400,
        -32600,
    ),
    # not JSON (RFC 8259), though Python's json takes them: found in review reaching a tool call
    ("nan_argument", b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
     b'"params":{"name":"list_nodes","arguments":{"x":NaN}}}', {}, 400, -32700),
    ("infinity_param", b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":-Infinity}}', {}, 400, -32700),
    ("overflowing_number", b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":1e400}}', {}, 400, -32700),
    ("utf8_bom", b"\xef\xbb\xbf" + PING, {}, 400, -32700),
    ("utf16", PING.decode().encode("utf-16"), {}, 400, -32700),
    ("utf16_without_bom", PING.decode().encode("utf-16-le"), {}, 400, -32700),
    ("utf32", PING.decode().encode("utf-32"), {}, 400, -32700),
]  # fmt: skip


@pytest.mark.parametrize("case", LEGACY_FAULTS, ids=[c[0] for c in LEGACY_FAULTS])
def test_legacy_faults(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str, case: tuple[Any, ...]
) -> None:
    _, body, extra, status, code = case
    before = len(audit_rows(env.config.audit_path))
    r = http.post(env.url, content=body, headers={**legacy_headers(token), **extra})
    assert r.status_code == status, r.text
    assert error_of(r)["code"] == code
    new = audit_rows(env.config.audit_path)[before:]
    assert any(row["kind"] == "refusal" for row in new), new  # every refusal leaves a record


def test_wrong_content_type_is_415(gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str) -> None:
    r = http.post(env.url, content=b"{}", headers=legacy_headers(token, **{"content-type": "text/plain"}))
    assert r.status_code == 415 and error_of(r)["code"] == -32600


def test_accept_without_json_is_406(gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str) -> None:
    r = http.post(
        env.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers=legacy_headers(token, accept="text/html"),
    )
    assert r.status_code == 406


@pytest.mark.parametrize(
    ("accept", "status"),
    [
        ("application/json;q=0", 406),
        ("application/json; q=0.000", 406),
        ("application/json;q=0, */*", 406),  # the most specific range decides (RFC 9110 §12.5.1)
        ("*/*;q=0", 406),
        ("application/json;q=2", 406),  # not a weight
        ("application/json;q=0.001", 200),
        ("text/html;q=0, application/*;q=0.5", 200),
        ("application/json;q=0.5, text/event-stream", 200),
    ],
)
def test_accept_weights_are_honoured(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str, accept: str, status: int
) -> None:
    r = http.post(env.url, content=PING, headers=legacy_headers(token, accept=accept))
    assert r.status_code == status, r.text
    if status == 406:
        assert error_of(r)["message"] == "Accept must allow application/json"


def test_get_and_delete_are_405(gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str) -> None:
    for method in ("GET", "DELETE"):
        r = http.request(method, env.url, headers=legacy_headers(token))
        assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_notifications_are_accepted_with_202(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    r = http.post(
        env.url,
        json={"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
        headers=legacy_headers(token),
    )
    assert r.status_code == 202 and r.content == b""


def test_oversize_body_is_413_before_parsing(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    body = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"pad":"'
        + b"x" * (env.config.max_body_bytes + 10)
        + b'"}}'
    )
    r = http.post(env.url, content=body, headers=legacy_headers(token))
    assert r.status_code == 413 and error_of(r)["code"] == -32600


def test_foreign_origin_is_403_and_own_origin_passes(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    r = http.post(env.url, json=body, headers=legacy_headers(token, origin="https://evil.example"))
    assert r.status_code == 403
    assert env.config.public_url
    ok = http.post(env.url, json=body, headers=legacy_headers(token, origin=env.config.public_url))
    assert ok.status_code == 200


def test_unlisted_host_is_421(gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str) -> None:
    r = http.post(
        env.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers=legacy_headers(token, host="attacker.example"),
    )
    assert r.status_code == 421


# ---- 2026-07-28 -------------------------------------------------------------------------------


def test_modern_unsupported_version_names_the_supported_ones(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    body = modern_body("tools/list", {})
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    r = http.post(
        env.url, json=body, headers={**modern_headers(token, "tools/list"), "mcp-protocol-version": "2099-01-01"}
    )
    assert r.status_code == 400
    err = error_of(r)
    assert err["code"] == -32022 and err["data"] == {"supported": ["2026-07-28"], "requested": "2099-01-01"}


@pytest.mark.parametrize(
    ("name", "mutate", "code", "status"),
    [
        ("method_header_mismatch", lambda b, h: h.update({"mcp-method": "tools/list"}), -32020, 400),
        ("name_header_mismatch", lambda b, h: h.update({"mcp-name": "reboot_everything"}), -32020, 400),
        ("missing_envelope", lambda b, h: b["params"].pop("_meta"), -32602, 400),
        (
            "missing_capabilities",
            lambda b, h: b["params"]["_meta"].pop("io.modelcontextprotocol/clientCapabilities"),
            -32602,
            400,
        ),
        (
            "body_version_mismatch",
            lambda b, h: b["params"]["_meta"].update({"io.modelcontextprotocol/protocolVersion": "2025-11-25"}),
            -32020,
            400,
        ),
        (
            "initialize_is_gone",
            lambda b, h: (b.update({"method": "initialize"}), h.update({"mcp-method": "initialize"})),
            -32601,
            404,
        ),
        ("ping_is_gone", lambda b, h: (b.update({"method": "ping"}), h.update({"mcp-method": "ping"})), -32601, 404),
        ("bad_arguments_type", lambda b, h: b["params"].update({"arguments": "rm -rf"}), -32602, 400),
    ],
)
def test_modern_ladder(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str, name: str, mutate: Any, code: int, status: int
) -> None:
    body = modern_body("tools/call", {"name": "list_nodes", "arguments": {}})
    headers = modern_headers(token, "tools/call", "list_nodes")
    mutate(body, headers)
    r = http.post(env.url, json=body, headers=headers)
    assert r.status_code == status, r.text
    assert error_of(r)["code"] == code


def test_modern_duplicate_routing_header_is_refused(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    headers = [*modern_headers(token, "tools/list").items(), ("mcp-method", "tools/list")]
    r = http.post(env.url, content=json.dumps(modern_body("tools/list", {})).encode(), headers=headers)
    assert r.status_code == 400 and error_of(r)["code"] == -32020


@pytest.mark.parametrize("first", ["2025-11-25", "modern"])
def test_a_protocol_version_header_sent_twice_is_refused_whichever_copy_comes_first(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str, first: str
) -> None:
    """Routing by the first copy while an intermediary reads the last would split the two on the era:
    refused in both eras, before the era is chosen."""
    modern = modern_headers(token, "tools/list")
    versions = ["2025-11-25", modern["mcp-protocol-version"]]
    if first == "modern":
        versions.reverse()
    rest = [(k, v) for k, v in modern.items() if k != "mcp-protocol-version"]
    headers = [*rest, *(("mcp-protocol-version", v) for v in versions)]
    r = http.post(env.url, content=json.dumps(modern_body("tools/list", {})).encode(), headers=headers)
    assert r.status_code == 400 and error_of(r)["code"] == -32020, r.text


def test_modern_unknown_tool_and_notification(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    r = modern_post(http, env.url, token, "tools/call", {"name": "no_such_tool", "arguments": {}})
    assert r.status_code == 400 and error_of(r)["code"] == -32602
    n = http.post(
        env.url,
        json={"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}},
        headers=modern_headers(token, "notifications/cancelled"),
    )
    assert n.status_code == 202


def test_modern_forged_request_state_is_refused(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, token: str
) -> None:
    before = len(audit_rows(env.config.audit_path))
    r = modern_post(
        http, env.url, token, "tools/call", {"name": "list_nodes", "arguments": {}, "requestState": "eyJhIjoiYiJ9.AAAA"}
    )
    err = error_of(r)
    assert r.status_code == 400 and err["code"] == -32602 and "requestState refused" in err["message"]
    assert any(row["outcome"] == "request_state_refused" for row in audit_rows(env.config.audit_path)[before:])
