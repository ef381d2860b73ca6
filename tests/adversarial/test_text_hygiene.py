"""Lone surrogates from a token holder, in every position, through the live gateway.

A JSON escape such as "\\ud800" decodes to a Python str that cannot be encoded
again; before the edge refused it, it ran an allowed call and then answered 500
(id), closed the connection unanswered (method), or failed audit writes. The
simulator's request log is the witness that nothing poisoned reached Proxmox.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.adversarial.tokens import claims, hand_signed
from tests.support import GatewayThread

LEGACY = "2025-06-18"
NODES_READ = "/api2/json/nodes"  # what list_nodes reads from Proxmox


def body(*, id_: str = "1", method: str = '"tools/call"', name: str = '"list_nodes"', arguments: str = "{}") -> bytes:
    """A tools/call written as text, so escapes reach the gateway exactly as typed."""
    params = f'{{"name":{name},"arguments":{arguments}}}'
    return f'{{"jsonrpc":"2.0","id":{id_},"method":{method},"params":{params}}}'.encode()


# position -> (body, JSON-RPC code, HTTP status in the 2025-06-18 era, reply id)
POSITIONS: dict[str, tuple[bytes, int, int, Any]] = {
    "tool_name": (body(name='"list_nodes\\ud800"'), -32602, 200, 1),
    "argument_key": (body(arguments='{"\\ud800":"default"}'), -32602, 200, 1),
    "argument_value": (body(arguments='{"cluster":"default\\udfff"}'), -32602, 200, 1),
    "jsonrpc_id": (body(id_='"\\ud800"'), -32600, 400, None),
    "method": (body(method='"tools/call\\ud800"'), -32600, 400, 1),
}


def headers(token: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": LEGACY,
    }


def client(env: DevEnv, connections: int = 4) -> httpx.AsyncClient:
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    return httpx.AsyncClient(verify=ctx, timeout=60.0, limits=httpx.Limits(max_connections=connections))


def nodes_reads(sim: Any) -> int:
    return sum(1 for e in sim.requests_log() if e["method"] == "GET" and e["path"].endswith(NODES_READ))


async def test_the_witness_sees_an_ordinary_call(advgw: GatewayThread, advenv: DevEnv, advsim: Any) -> None:
    """The same call without the surrogate does reach Proxmox: the log below can show a leak."""
    advsim.clear_logs()
    async with client(advenv) as http:
        r = await http.post(advenv.url, content=body(), headers=headers(advenv.token("text-ok", ["operator"])))
    assert r.status_code == 200 and r.json()["result"]["isError"] is False, r.text
    assert nodes_reads(advsim) == 1


@pytest.mark.parametrize("position", sorted(POSITIONS))
async def test_lone_surrogate_is_refused_before_dispatch(
    position: str, advgw: GatewayThread, advenv: DevEnv, advsim: Any
) -> None:
    raw, code, status, reply_id = POSITIONS[position]
    db = advenv.config.audit_path
    before = max_seq(db)
    advsim.clear_logs()
    sub = f"text-{position}"
    async with client(advenv) as http:
        r = await http.post(advenv.url, content=raw, headers=headers(advenv.token(sub, ["operator"])))
    assert r.status_code == status, (r.status_code, r.text)
    doc = r.json()
    assert doc["id"] == reply_id and doc["error"]["code"] == code, doc
    assert "not valid Unicode text" in doc["error"]["message"]
    assert nodes_reads(advsim) == 0 and advsim.requests_log() == [], advsim.requests_log()[:3]
    rows = rows_after(db, before)
    assert [(r["kind"], r["outcome"], r["principal"]) for r in rows] == [("refusal", "protocol_error", sub)]
    recorded = json.loads(rows[0]["body"])
    assert recorded["code"] == code and "not valid Unicode text" in recorded["reason"]
    recorded["reason"].encode("utf-8")  # stored escaped: the record itself is valid text


async def test_modern_era_refuses_with_its_status(advgw: GatewayThread, advenv: DevEnv, advsim: Any) -> None:
    advsim.clear_logs()
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    }
    raw = (
        '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"list_nodes",'
        f'"arguments":{{"cluster":"\\ud800"}},"_meta":{json.dumps(meta)}}}}}'
    ).encode()
    h = headers(advenv.token("text-modern", ["operator"]))
    h.update({"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "list_nodes"})
    async with client(advenv) as http:
        r = await http.post(advenv.url, content=raw, headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32602 and r.json()["id"] == 7, r.text
    assert advsim.requests_log() == []


async def test_surrogate_subject_is_a_401(advgw: GatewayThread, advenv: DevEnv, advsim: Any) -> None:
    """pyjwt would refuse to mint this; the bytes are signed by hand with the gateway's HS256 secret."""
    db = advenv.config.audit_path
    before = max_seq(db)
    advsim.clear_logs()
    token = hand_signed(advenv, claims("agent-\ud800"))
    async with client(advenv) as http:
        r = await http.post(advenv.url, content=body(), headers=headers(token))
        control = await http.post(advenv.url, content=body(), headers=headers(hand_signed(advenv, claims("agent-x"))))
    assert control.status_code == 200, control.text  # the hand-made signature itself is good
    assert r.status_code == 401 and r.json()["error"] == "invalid_token", r.text
    assert "sub" in r.json()["error_description"] and "Unicode" in r.headers["www-authenticate"]
    rows = [row for row in rows_after(db, before) if row["kind"] == "auth_failure"]
    assert len(rows) == 1 and rows[0]["principal"] is None
    assert nodes_reads(advsim) == 1  # the control call only


async def test_poisoned_requests_never_fail_another_principals_calls(
    advgw: GatewayThread, advenv: DevEnv, advsim: Any
) -> None:
    """20 hostile requests (every position, in turn) interleaved with 60 ordinary ones from someone else."""
    advsim.clear_logs()
    hostile = advenv.token("text-hostile", ["operator"])
    good = advenv.token("text-good", ["operator"])
    bad_token = hand_signed(advenv, claims("text-\udbff"))
    positions = sorted(POSITIONS)

    async with client(advenv, connections=16) as http:

        async def poisoned(i: int) -> httpx.Response:
            if i % 6 == 5:
                return await http.post(advenv.url, content=body(), headers=headers(bad_token))
            return await http.post(advenv.url, content=POSITIONS[positions[i % 5]][0], headers=headers(hostile))

        async def ordinary(i: int) -> httpx.Response:
            return await http.post(advenv.url, content=body(id_=str(1000 + i)), headers=headers(good))

        jobs = [poisoned(i) for i in range(20)] + [ordinary(i) for i in range(60)]
        order = [j for pair in zip(jobs[:20], jobs[20:40], strict=True) for j in pair] + jobs[40:]
        results = await asyncio.gather(*order)
    oks = [r for r in results if r.request.headers["authorization"] == f"Bearer {good}"]
    bad = [r for r in results if r.request.headers["authorization"] != f"Bearer {good}"]
    assert len(oks) == 60 and len(bad) == 20
    for r in oks:
        assert r.status_code == 200 and r.json()["result"]["isError"] is False, r.text
    assert sorted(r.json()["id"] for r in oks) == list(range(1000, 1060))
    for r in bad:
        assert r.status_code in (200, 400, 401) and ("error" in r.json()), r.text
    assert nodes_reads(advsim) == 60  # exactly the ordinary calls reached Proxmox


async def test_approval_api_refuses_a_surrogate_note(advgw: GatewayThread, advenv: DevEnv) -> None:
    """The approvers' JSON API parses client text too: refused before the request is even looked up."""
    token = advenv.token("text-approver", ["approver"], groups=["sre-leads"], kind="human")
    url = f"https://127.0.0.1:{advenv.config.port}/admin/approvals/no-such-id/approve"
    h = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    async with client(advenv) as http:
        r = await http.post(url, content=b'{"note":"fine \\ud800"}', headers=h)
        control = await http.post(url, content=b'{"note":"fine"}', headers=h)
    assert control.status_code == 404, control.text  # the lookup is what answers a clean note
    assert r.status_code == 400 and "not valid Unicode text" in r.text, r.text


@pytest.mark.parametrize("nested", [b"[" * 3000 + b"]" * 3000, b'{"note":' + b'{"a":' * 2000 + b"1" + b"}" * 2001])
async def test_approval_api_refuses_a_deeply_nested_body(nested: bytes, advgw: GatewayThread, advenv: DevEnv) -> None:
    """Nesting deeper than the JSON parser's recursion limit is the client's mistake: a 400, not
    a 500 (or a dropped connection), and the same connection still serves the next request."""
    assert len(nested) < 16_384  # under the admin body cap: the parser, not the cap, must refuse it
    token = advenv.token("text-approver", ["approver"], groups=["sre-leads"], kind="human")
    url = f"https://127.0.0.1:{advenv.config.port}/admin/approvals/no-such-id/approve"
    h = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    async with client(advenv, connections=1) as http:
        r = await http.post(url, content=nested, headers=h)
        control = await http.post(url, content=b'{"note":"fine"}', headers=h)
    assert r.status_code == 400 and r.json()["detail"] == "body must be JSON: nested too deeply", r.text
    assert control.status_code == 404, control.text
