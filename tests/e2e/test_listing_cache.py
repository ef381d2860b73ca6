"""tools/list answers are reused for a few seconds per principal; calls are still decided one by one."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.policy.decisions import DecisionClient
from tests.mcp.wire import modern_post
from tests.support import GatewayThread


@dataclass
class Listings:
    asked: list[dict[str, Any]] = field(default_factory=list)  # the listing inputs that reached OPA
    now: float = 1000.0  # the cache's clock


@pytest.fixture
def opa_listings(gateway: GatewayThread) -> Iterator[Listings]:
    """Counts the listing queries that reach OPA (each still answered by the real OPA)."""
    c = gateway.components
    spy = Listings()
    real = DecisionClient.visible_tools.__get__(c.decisions)

    async def counting(input_doc: dict[str, Any]) -> frozenset[str] | None:
        spy.asked.append(input_doc)
        return await real(input_doc)

    saved_clock = c.listings.clock
    c.decisions.visible_tools = counting  # type: ignore[method-assign]
    c.listings.clock = lambda: spy.now
    c.listings._entries.clear()
    try:
        yield spy
    finally:
        del c.decisions.visible_tools
        c.listings.clock = saved_clock
        c.listings._entries.clear()


async def _names(env: DevEnv, token: str) -> set[str]:
    async with mcp_client(env.url, token, env.ca_file) as client:
        return {t.name for t in (await client.list_tools()).tools}


async def test_a_listing_is_reused_per_principal_until_it_expires(
    gateway: GatewayThread, env: DevEnv, opa_listings: Listings
) -> None:
    asked = opa_listings.asked
    operator = env.token("listing-operator", ["operator"])
    viewer = env.token("listing-viewer", ["viewer"])

    first = await _names(env, operator)
    assert len(asked) == 1 and "list_nodes" in first
    assert await _names(env, operator) == first
    assert len(asked) == 1  # the same principal within the TTL: no second query

    seen_by_viewer = await _names(env, viewer)
    assert len(asked) == 2  # another principal is asked about on its own
    assert seen_by_viewer != first

    opa_listings.now += gateway.components.listings.ttl + 0.1
    assert await _names(env, operator) == first
    assert len(asked) == 3  # expired: asked again


async def test_calls_are_still_decided_one_by_one(gateway: GatewayThread, env: DevEnv, opa_listings: Listings) -> None:
    viewer = env.token("listing-viewer-2", ["viewer"])
    assert "vm_stop" not in await _names(env, viewer)
    async with mcp_client(env.url, viewer, env.ca_file) as client:
        res = await client.call_tool("vm_stop", {"vmid": 100})
    assert res.is_error and "Denied by policy" in " ".join(c.text for c in res.content)


def _list(env: DevEnv, token: str, version: str, id_: int = 7) -> httpx.Response:
    """One tools/list over HTTP, its reply as sent (legacy eras)."""
    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": version,
    }
    body = {"jsonrpc": "2.0", "id": id_, "method": "tools/list", "params": {}}
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as http:
        r = http.post(env.url, json=body, headers=headers)
    assert r.status_code == 200
    return r


def _expected(gateway: GatewayThread, visible: frozenset[str], version: str) -> list[dict[str, Any]]:
    """The tool list as it was built before listings were encoded once: mcp_view of each visible tool."""
    tools = [t.mcp_view for t in gateway.components.catalog if t.name in visible]
    if version == "2025-03-26":
        tools = [{k: v for k, v in t.items() if k not in ("title", "outputSchema")} for t in tools]
    return tools


@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
async def test_a_reused_listing_is_the_fresh_answer_byte_for_byte(
    gateway: GatewayThread, env: DevEnv, opa_listings: Listings, version: str
) -> None:
    """The pre-encoded tools/list reply is the JSON the tool definitions give, in catalog order,
    whether OPA was just asked or the answer is reused."""
    token = env.token("listing-bytes", ["operator"])
    fresh = _list(env, token, version)
    assert len(opa_listings.asked) == 1
    reused = _list(env, token, version)
    assert len(opa_listings.asked) == 1  # answered from the cache
    assert reused.content == fresh.content
    doc = json.loads(fresh.content)
    assert doc["jsonrpc"] == "2.0" and doc["id"] == 7 and set(doc) == {"jsonrpc", "id", "result"}
    names = [t["name"] for t in doc["result"]["tools"]]
    assert len(names) == len(set(names)) > 10
    visible = gateway.components.listings.get(next(iter(gateway.components.listings._entries)))
    assert visible is not None
    assert doc["result"]["tools"] == _expected(gateway, visible, version)
    # another id gets its own envelope around the same list
    other = json.loads(_list(env, token, version, id_="abc").content)
    assert other["id"] == "abc" and other["result"] == doc["result"]


async def test_a_modern_listing_keeps_its_result_fields(
    gateway: GatewayThread, env: DevEnv, opa_listings: Listings
) -> None:
    token = env.token("listing-modern", ["operator"])
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as http:
        first = modern_post(http, env.url, token, "tools/list", {}).json()["result"]
        again = modern_post(http, env.url, token, "tools/list", {}).json()["result"]
    assert len(opa_listings.asked) == 1 and again == first
    assert first["cacheScope"] == "private" and first["resultType"] == "complete" and "ttlMs" in first
    assert first["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "pvegate"
    names = {t["name"] for t in first["tools"]}
    assert "list_nodes" in names and "title" in first["tools"][0]


async def test_reused_bytes_never_cross_principals(gateway: GatewayThread, env: DevEnv, opa_listings: Listings) -> None:
    """Each principal gets the tools OPA named for it, reused or not, in any order of asking."""
    operator = env.token("listing-cross-op", ["operator"])
    viewer = env.token("listing-cross-viewer", ["viewer"])
    answers: dict[str, list[bytes]] = {"op": [], "viewer": []}
    for who, tok in [("op", operator), ("viewer", viewer), ("op", operator), ("viewer", viewer)]:
        answers[who].append(_list(env, tok, "2025-06-18").content)
    assert len(opa_listings.asked) == 2  # one query per principal, then reused
    assert answers["op"][0] == answers["op"][1] and answers["viewer"][0] == answers["viewer"][1]
    op_names = {t["name"] for t in json.loads(answers["op"][0])["result"]["tools"]}
    viewer_names = {t["name"] for t in json.loads(answers["viewer"][0])["result"]["tools"]}
    assert "vm_stop" in op_names and "vm_stop" not in viewer_names and viewer_names < op_names
