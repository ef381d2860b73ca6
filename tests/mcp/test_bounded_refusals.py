"""Refusals written before any quota or policy applies (invalid arguments, an unknown tool, a
protocol fault) quote the client's own text: only a bounded part of it reaches the audit row and
the reply, whatever the request's size and whoever sends it (a principal with no role too)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.support import GatewayThread

ROW_MAX = 4096  # bytes an audit row's tool + body may take for such a refusal
REPLY_MAX = 4096


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=60) as client:
        yield client


def post(env: DevEnv, http: httpx.Client, who: str, roles: list[str], doc: dict[str, Any]) -> httpx.Response:
    body = json.dumps(doc).encode()
    h = {
        "authorization": f"Bearer {env.token(who, roles)}",
        "accept": "application/json",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-06-18",
    }
    return http.post(env.url, content=body, headers=h)


def tool_call(name: str, arguments: Any, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def row_size(row: dict[str, Any]) -> int:
    return len(row["tool"] or "") + len(row["body"] or "")


@pytest.mark.parametrize("roles", [["viewer"], []])
def test_a_megabyte_of_unknown_arguments_gives_a_small_row_and_reply(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, roles: list[str]
) -> None:
    args = {f"k{i:058d}": 0 for i in range(14000)}
    doc = tool_call("list_nodes", args)
    assert len(json.dumps(doc)) > 900_000
    db = env.config.audit_path
    before = max_seq(db)
    r = post(env, http, "bloat-agent", roles, doc)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) < REPLY_MAX, len(r.content)
    result = r.json()["result"]
    text = result["content"][0]["text"]
    assert result["isError"] and result["_meta"]["pvegate/outcome"] == "invalid"
    assert text.startswith("invalid argument k" + "0" * 58 + ", ") and "and 13990 more" in text, text
    assert text.endswith(": not a parameter of this tool"), text
    rows = [row for row in rows_after(db, before) if row["principal"] == "bloat-agent"]
    assert [(row["kind"], row["outcome"]) for row in rows] == [("refusal", "invalid")]
    assert row_size(rows[0]) < ROW_MAX, row_size(rows[0])


def test_long_unknown_argument_names_are_cut(gateway: GatewayThread, env: DevEnv, http: httpx.Client) -> None:
    args = {("x" * 5000) + str(i): 0 for i in range(20)}
    r = post(env, http, "bloat-agent", ["viewer"], tool_call("list_nodes", args))
    text = r.json()["result"]["content"][0]["text"]
    assert len(text) <= 1025 and "x" * 5000 not in text, text


@pytest.mark.parametrize("roles", [["viewer"], []])
def test_a_900_kb_unknown_tool_name_gives_a_small_row_and_reply(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, roles: list[str]
) -> None:
    name = "x" * 900_000
    db = env.config.audit_path
    before = max_seq(db)
    r = post(env, http, "bloat-namer", roles, tool_call(name, {}))
    assert len(r.content) < REPLY_MAX, len(r.content)
    err = r.json()["error"]
    assert err["code"] == -32602 and err["message"] == f"Unknown tool: {'x' * 200}…[900000 characters]", err
    rows = [row for row in rows_after(db, before) if row["principal"] == "bloat-namer"]
    assert [(row["kind"], row["outcome"]) for row in rows] == [("refusal", "unknown_tool")]
    assert rows[0]["tool"] == f"{'x' * 200}…[900000 characters]"
    assert row_size(rows[0]) < ROW_MAX, row_size(rows[0])


def test_a_900_kb_method_name_gives_a_small_row_and_reply(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client
) -> None:
    db = env.config.audit_path
    before = max_seq(db)
    r = post(env, http, "bloat-method", [], {"jsonrpc": "2.0", "id": 1, "method": "m" * 900_000})
    assert len(r.content) < REPLY_MAX, len(r.content)
    assert r.json()["error"]["code"] == -32601
    rows = [row for row in rows_after(db, before) if row["principal"] == "bloat-method"]
    assert [(row["kind"], row["outcome"]) for row in rows] == [("refusal", "protocol_error")]
    assert row_size(rows[0]) < ROW_MAX, row_size(rows[0])


@pytest.mark.parametrize("value", ["false", "true", 0, 1, [], {}, None])
def test_a_non_boolean_dry_run_is_invalid_params(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, value: Any
) -> None:
    r = post(env, http, "dry-agent", ["viewer"], tool_call("list_nodes", {}, {"dry_run": value}))
    err = r.json()["error"]
    assert err["code"] == -32602 and "_meta.dry_run" in err["message"], err


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_dry_run_is_taken(gateway: GatewayThread, env: DevEnv, http: httpx.Client, value: bool) -> None:
    r = post(env, http, "dry-agent", ["viewer"], tool_call("list_nodes", {}, {"dry_run": value}))
    assert "result" in r.json(), r.text[:300]
