"""Deeply nested (but parseable) bodies: a clean JSON-RPC parse error, never an HTTP 500.

Before the parser bounded nesting, a tools/call whose arguments nested ~600 levels reached the
requestState digest (on the raw, unvalidated arguments: the modern era's retry, the legacy era's
URL-elicitation recall) and its recursive redaction of a sensitive tool's arguments, which ran
into Python's recursion limit."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator

import httpx
import pytest

from gateway.core.jsonread import NotJson, loads
from gateway.core.redaction import REDACTED, redact_keys, redact_path
from gateway.dev.devenv import DevEnv
from gateway.mcp.jsonrpc import INVALID_PARAMS, MAX_DEPTH, PARSE_ERROR, RpcFault, parse_message
from tests.mcp.wire import modern_body, modern_headers
from tests.support import GatewayThread

DEPTHS = (MAX_DEPTH, 400, 600, 800, 950)


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=60) as client:
        yield client


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def assert_parse_error(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:200])
    err = r.json()["error"]
    assert err["code"] == PARSE_ERROR and f"nested deeper than {MAX_DEPTH} levels" in err["message"], err


@pytest.mark.parametrize("depth", DEPTHS)
def test_modern_retry_with_deep_arguments_is_a_parse_error(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, depth: int
) -> None:
    token = env.token("deep-agent", ["viewer"])
    body = modern_body("tools/call", {"name": "vm_cloudinit_set", "arguments": {"x": 1}, "requestState": "a.b"})
    raw = json.dumps(body).replace('{"x": 1}', '{"x": ' + nested(depth) + "}")
    r = http.post(env.url, content=raw, headers=modern_headers(token, "tools/call", "vm_cloudinit_set"))
    assert_parse_error(r)


@pytest.mark.parametrize("depth", DEPTHS)
def test_legacy_url_elicitation_session_with_deep_arguments_is_a_parse_error(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, depth: int
) -> None:
    token = env.token("deep-agent", ["viewer"])
    h = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {"url": {}}},
            "clientInfo": {"name": "deep", "version": "1"},
        },
    }
    sid = http.post(env.url, json=init, headers=h).headers["mcp-session-id"]
    raw = (
        '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"vm_cloudinit_set","arguments":{"x":'
        + nested(depth)
        + "}}}"
    )
    r = http.post(env.url, content=raw, headers={**h, "mcp-protocol-version": "2025-11-25", "mcp-session-id": sid})
    assert_parse_error(r)


def test_a_tool_call_at_the_depth_limit_is_parsed() -> None:
    # message (1), params (2), arguments (3), then lists down to MAX_DEPTH levels in all
    inner = nested(MAX_DEPTH - 3)
    raw = '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","arguments":{"x":' + inner + "}}}"
    msg = parse_message(raw.encode())
    assert msg.method == "tools/call"
    deeper = raw.replace(inner, nested(MAX_DEPTH - 2))
    with pytest.raises(RpcFault) as fault:
        parse_message(deeper.encode())
    assert fault.value.code == PARSE_ERROR and fault.value.code != INVALID_PARAMS


def deep_doc(depth: int, leaf: object) -> object:
    doc = leaf
    for i in range(depth):
        doc = {"password": "hunter2", "next": doc} if i % 2 else [doc, {"password": "x"}]
    return doc


def test_redact_keys_takes_any_depth_without_recursion() -> None:
    doc = deep_doc(5000, "end")
    out = redact_keys(doc, {"password"})
    node, levels = out, 0
    while not isinstance(node, str):
        if isinstance(node, dict):
            assert node["password"] == REDACTED
            node = node["next"]
        else:
            assert node[1] == {"password": REDACTED}
            node = node[0]
        levels += 1
    assert node == "end" and levels == 5000
    probe = doc  # the original is untouched
    while not isinstance(probe, str):
        if isinstance(probe, dict):
            assert probe["password"] == "hunter2"
            probe = probe["next"]
        else:
            probe = probe[0]


def test_redact_keys_copies_and_keeps_order() -> None:
    doc = {"a": [1, {"b": 2, "pw": "s"}, [3, {"pw": "t"}]], "pw": {"deep": 1}, "z": None}
    out = redact_keys(doc, frozenset({"pw"}))
    assert out == {"a": [1, {"b": 2, "pw": REDACTED}, [3, {"pw": REDACTED}]], "pw": REDACTED, "z": None}
    assert list(out) == ["a", "pw", "z"] and list(out["a"][1]) == ["b", "pw"]
    out["a"][1]["b"] = 9
    assert doc["a"][1]["b"] == 2  # new containers
    assert redact_keys("text", {"pw"}) == "text"


def test_redact_path_in_place() -> None:
    doc = {"items": [{"s": 1, "k": 2}, {"s": 3}], "m": {"x": {"s": 4}, "y": {"s": 5}}, "l": [1, 2]}
    for path in ("items.*.s", "m.*.s", "l.1", "absent.path", "items.5.s"):
        redact_path(doc, path.split("."))
    assert doc == {
        "items": [{"s": REDACTED, "k": 2}, {"s": REDACTED}],
        "m": {"x": {"s": REDACTED}, "y": {"s": REDACTED}},
        "l": [1, REDACTED],
    }
    redact_path(doc, ["m", "*"])
    assert doc["m"] == {"x": REDACTED, "y": REDACTED}
    redact_path(doc, ["l", "*"])
    assert doc["l"] == [REDACTED, REDACTED]


def test_deep_json_is_refused_by_the_parser_bound() -> None:
    with pytest.raises(NotJson):
        loads(nested(MAX_DEPTH + 1), max_depth=MAX_DEPTH)
