"""One client's slow reads filling the connection pool do not make the API look down to everyone.

A cluster's API pool holds 32 connections, as many as one principal may have calls in flight. A
principal (or one slow node behind pveproxy) whose reads drip their answers held every connection;
the others' requests then waited for a free slot, failed as "connect timeouts" and counted toward
the shared circuit breaker, and the breaker's own probe (GET /version) waited behind the same pool,
failed too, and opened the circuit: every principal refused, for an API that answered at once.
A full pool now fails the waiting request alone (nothing was sent: not an outage), and the gateway's
GET /version has connections of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.tools.runtimes.base import UpstreamError
from gateway.tools.runtimes.pve_api import PveApiClient
from tests.connectors.test_upstream_answers import Upstream, cluster, ok


async def drip(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(100):  # a byte within every read timeout: held to the request's deadline
        await asyncio.sleep(0.15)
        writer.write(b" ")
        await writer.drain()


def handler(method: str, path: str, headers: dict[str, str]) -> Any:
    if path == "/slow":
        return drip
    if path in ("/version", "/nodes"):
        return ok({"version": "8.4"} if path == "/version" else [{"node": "pve1"}])
    return None


async def test_a_full_pool_does_not_open_the_circuit(tmp_path: Path) -> None:
    async with Upstream(handler) as url:
        client = PveApiClient(cluster(url, tmp_path, timeout=0.3))
        slow = [asyncio.ensure_future(client.request("GET", "/slow")) for _ in range(32)]
        try:
            await asyncio.sleep(0.1)  # every pooled connection is held by a dripping read
            assert await asyncio.wait_for(client.ping(), 2) == 200  # the gateway's own probe still gets through
            others = await asyncio.gather(
                *(client.request("GET", "/nodes") for _ in range(2 * client.breaker.threshold)),
                return_exceptions=True,
            )
            assert all(isinstance(r, UpstreamError) and r.cause == "busy" for r in others), others  # each alone
            assert "are all busy with other calls" in str(others[0]) and "nothing was sent" in str(others[0])
            assert client.breaker.state == "closed" and client.breaker.opens == 0, client.breaker.describe()
        finally:
            for t in slow:
                t.cancel()
            await asyncio.gather(*slow, return_exceptions=True)
        assert await client.request("GET", "/nodes") == [{"node": "pve1"}]
        assert client.breaker.state == "closed"
        await client.close()
