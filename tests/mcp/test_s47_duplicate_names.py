"""A JSON object naming a member twice is refused, not read as its last copy (found in review).

Python's json keeps the last copy; other readers keep the first or refuse (RFC 8259 §4 leaves it open,
I-JSON, RFC 7493 §2.3, forbids it). So `{"name": "list_nodes", ..., "name": "vm_destroy"}` was decided and
run as vm_destroy while a proxy, WAF or log reader in front could take it for a listing. Refused with a
parse error before anything is decided, on the live gateway, in both eras; and on the admin API
(tests/approvals/test_s47_duplicate_names.py) and in a token's claims (tests/auth/test_authenticator.py)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.support import GatewayThread


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as client:
        yield client


def _headers(env: DevEnv, version: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {env.token('s47-agent', ['operator'])}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": version,
    }


BODIES = [
    (
        "tool_name",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        b'"params":{"name":"list_nodes","arguments":{},"name":"vm_destroy"}}',
        "name",
    ),
    (
        "argument",
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call",'
        b'"params":{"name":"vm_status","arguments":{"vmid":100,"vmid":101}}}',
        "vmid",
    ),
    ("method", b'{"jsonrpc":"2.0","id":3,"method":"tools/list","method":"tools/call","params":{}}', "method"),
    ("id", b'{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{},"id":5}', "id"),
]


@pytest.mark.parametrize(("body", "name"), [b[1:] for b in BODIES], ids=[b[0] for b in BODIES])
@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_a_member_named_twice_is_refused_before_any_decision(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, version: str, body: bytes, name: str
) -> None:
    before = max_seq(env.config.audit_path)
    r = http.post(env.url, content=body, headers=_headers(env, version))
    assert r.status_code == 400, (r.status_code, r.text)
    doc = r.json()
    assert doc["id"] is None and doc["error"]["code"] == -32700, doc
    assert f'the name "{name}" appears more than once in one object' in doc["error"]["message"], doc
    assert "Traceback" not in r.text
    rows = rows_after(env.config.audit_path, before)
    assert [row["outcome"] for row in rows] == ["protocol_error"], rows  # refused and audited; nothing decided


def test_the_same_body_with_unique_names_is_served(gateway: GatewayThread, env: DevEnv, http: httpx.Client) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_nodes","arguments":{}}}'
    r = http.post(env.url, content=body, headers=_headers(env, "2025-06-18"))
    assert r.status_code == 200 and "result" in r.json(), r.text
