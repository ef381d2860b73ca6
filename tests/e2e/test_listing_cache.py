"""tools/list answers are reused for a few seconds per principal; calls are still decided one by one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.policy.decisions import DecisionClient
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
