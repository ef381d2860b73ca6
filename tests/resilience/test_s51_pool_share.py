"""One principal's slow reads must not take every connection to a cluster's API from the others.

A cluster's API pool holds 32 connections, one shared queue for every principal's requests. A
principal within its own limits (32 calls in flight, each of them a composite or fan-out read that
sends several requests at once) could fill the pool *and* its queue with reads it knows Proxmox is
slow to answer: another principal's well-formed call then waited behind all of them and failed
`busy` ("all 32 connections to the API stayed busy"), though the API answered everything else at
once. Each principal now holds at most its share of the pool; the rest of its requests wait for its
own connections, never ahead of another principal's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.base import UpstreamError
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.runtimes.transport import CALLER
from tests.connectors.test_s49_pool_busy import handler
from tests.connectors.test_upstream_answers import Upstream, cluster
from tests.resilience.helpers import call, client, fresh_config, result_of, text_of, url_of
from tests.support import GatewayThread


@pytest.fixture(scope="module")
def pgw(renv: DevEnv) -> Iterator[GatewayThread]:
    # the production limit on calls in flight (the test environment lifts it)
    cfg = dataclasses.replace(fresh_config(renv, "pool-share"), max_inflight_per_principal=32)
    gw = GatewayThread(cfg).start()
    yield gw
    gw.stop()


async def one(renv: DevEnv, gw: GatewayThread, token: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async with client(renv) as http:
        r = await call(http, url_of(gw.config), token, tool, args)
    assert r.status_code == 200, r.text
    return result_of(r)


async def test_one_principals_slow_reads_leave_connections_for_another(
    renv: DevEnv, rsim: Any, pgw: GatewayThread
) -> None:
    mallory = renv.token("pool-mallory", ["viewer"], kind="service")
    bob = renv.token("pool-bob", ["viewer"], kind="service")

    async def bob_after(delay: float) -> dict[str, Any]:
        await asyncio.sleep(delay)
        return await one(renv, pgw, bob, "get_node_status", {"node": "pve1"})

    # every storage content read beyond the 1.5 s timeout: each of mallory's list_backups sends several
    rsim.set_faults(latency_ms=20000, latency_path="/storage/[^/]+/content$")
    try:
        slow = [asyncio.ensure_future(one(renv, pgw, mallory, "list_backups", {})) for _ in range(30)]
        # bob's calls while mallory's reads hold connections and queue for more (before: a quarter failed busy)
        results = await asyncio.gather(*(bob_after(0.25 * i) for i in range(1, 21)))
        for res in results:
            assert not res["isError"], text_of(res)
        await asyncio.gather(*slow, return_exceptions=True)
    finally:
        rsim.set_faults(latency_ms=0, latency_path=None)
    pool = pgw.components.runtimes["pve_api"].clients["default"]._http  # type: ignore[attr-defined]
    assert pool._shares == {}  # no caller's share outlives its requests


async def test_a_principal_past_its_share_is_told_it_is_its_own_calls(tmp_path: Path) -> None:
    async with Upstream(handler) as url:
        client = PveApiClient(cluster(url, tmp_path, timeout=0.3))
        token = CALLER.set("mallory")
        try:
            slow = [asyncio.ensure_future(client.request("GET", "/slow")) for _ in range(32)]
            await asyncio.sleep(0.1)
            mine = await asyncio.gather(client.request("GET", "/nodes"), return_exceptions=True)
        finally:
            CALLER.reset(token)
        try:
            assert isinstance(mine[0], UpstreamError) and mine[0].cause == "busy", mine
            assert "this principal's other calls hold all the connections" in str(mine[0]), mine[0]
            assert await client.request("GET", "/nodes") == [{"node": "pve1"}]  # the gateway's, or another's
            assert client.breaker.state == "closed" and client.breaker.failures == 0
        finally:
            for t in slow:
                t.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
            await client.close()
