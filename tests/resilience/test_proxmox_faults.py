"""A slow or failing Proxmox (simulator faults): bounded timeouts, a per-cluster
circuit breaker, clear tool errors (never a 5xx), no stuck connections, and
partial results where the tool's contract says so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.breaker import CircuitBreaker
from tests.resilience.helpers import call, client, fresh_config, result_of, text_of, url_of
from tests.support import GatewayThread


@pytest.fixture(scope="module")
def fgw(renv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(fresh_config(renv, "faults")).start()
    yield gw
    gw.stop()


@pytest.fixture
def breaker(fgw: GatewayThread) -> CircuitBreaker:
    b: CircuitBreaker = fgw.components.runtimes["pve_api"].clients["default"].breaker  # type: ignore[attr-defined]
    b.success()  # each test starts with a closed circuit
    b.cooldown = 1.0
    return b


@pytest.fixture
def token(renv: DevEnv, request: pytest.FixtureRequest) -> str:
    return renv.token(f"faults-{request.node.name[:40]}", ["operator"], kind="service")


async def one(
    renv: DevEnv, gw: GatewayThread, token: str, tool: str, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    async with client(renv) as http:
        r = await call(http, url_of(gw.config), token, tool, args)
    assert r.status_code == 200, r.text  # a Proxmox fault is a tool error, never an HTTP error
    return result_of(r)


def nodes_reads(rsim: Any) -> int:
    return sum(1 for e in rsim.requests_log() if e["method"] == "GET" and e["path"].endswith("/api2/json/nodes"))


async def test_slow_proxmox_times_out_with_a_clear_error_and_nothing_sticks(
    renv: DevEnv, rsim: Any, fgw: GatewayThread, breaker: CircuitBreaker, token: str
) -> None:
    # far beyond the 1.5 s timeout, for the API as a whole (the breaker's own probe is GET /version)
    rsim.set_faults(latency_ms=20000, latency_path="^/(nodes|version)$")
    started = time.monotonic()
    res = await one(renv, fgw, token, "list_nodes")  # alone: three attempts, then a clear timeout
    assert res["isError"] and "did not answer in time" in text_of(res), text_of(res)
    assert time.monotonic() - started < 15  # three 1.5 s attempts; without the timeout it would take 20 s+
    assert breaker.state == "closed"  # three failures stay under the threshold
    started = time.monotonic()
    async with client(renv) as http:
        rs = await asyncio.gather(*(call(http, url_of(fgw.config), token, "list_nodes") for _ in range(8)))
    elapsed = time.monotonic() - started
    texts = []
    for r in rs:
        assert r.status_code == 200
        res = result_of(r)
        assert res["isError"]
        texts.append(text_of(res))
    # together they trip the breaker: a retry (or a late call) finds the circuit open
    assert all("did not answer in time" in t or "requests are paused" in t for t in texts), texts
    assert breaker.state == "open"
    # bounded by the timeout (1.5 s x 3 attempts), not by the 20 s the fault would take
    assert elapsed < 15, elapsed
    rsim.set_faults(latency_ms=0)
    breaker.success()
    res = await one(renv, fgw, token, "list_nodes")  # no connection left hanging in the pool
    assert not res["isError"], text_of(res)


async def test_failing_api_opens_the_circuit_then_recovers(
    renv: DevEnv, rsim: Any, fgw: GatewayThread, breaker: CircuitBreaker, token: str
) -> None:
    # 503: the API is unavailable (a 500 is Proxmox's answer about the request: test_breaker_shared)
    rsim.set_faults(error_rate=1.0, error_status=503, error_path="^/(nodes|version)$")
    for _ in range(breaker.threshold):
        res = await one(renv, fgw, token, "list_nodes")
        assert res["isError"] and "Proxmox answered 503" in text_of(res), text_of(res)
    assert breaker.state == "open"
    before = nodes_reads(rsim)
    res = await one(renv, fgw, token, "list_nodes")
    assert res["isError"] and "requests are paused" in text_of(res), text_of(res)
    assert nodes_reads(rsim) == before  # failed fast: Proxmox was not asked
    rsim.set_faults(error_rate=0)
    await asyncio.sleep(breaker.cooldown + 0.1)
    res = await one(renv, fgw, token, "list_nodes")  # the half-open probe succeeds
    assert not res["isError"], text_of(res)
    assert breaker.state == "closed"


async def test_node_unreachable_595_596_is_a_clear_error_and_does_not_trip(
    renv: DevEnv, rsim: Any, fgw: GatewayThread, breaker: CircuitBreaker, token: str
) -> None:
    for status in (595, 596):
        rsim.set_faults(error_rate=1.0, error_status=status, error_path="^/nodes/[^/]+/status$")
        for _ in range(breaker.threshold + 1):
            # get_node_status is the API read alone (get_node_capacity also reads df over SSH)
            res = await one(renv, fgw, token, "get_node_status", {"node": "pve1"})
            assert res["isError"] and "is unreachable from the API node" in text_of(res), text_of(res)
        assert breaker.state == "closed"  # one node's trouble does not stop the cluster
    res = await one(renv, fgw, token, "list_nodes")
    assert not res["isError"]


async def test_dropped_connections_are_retried_then_reported(
    renv: DevEnv, rsim: Any, fgw: GatewayThread, breaker: CircuitBreaker, token: str
) -> None:
    rsim.set_faults(drop_rate=1.0, drop_path="^/nodes$")
    before = nodes_reads(rsim)
    res = await one(renv, fgw, token, "list_nodes")
    assert res["isError"] and "unreachable" in text_of(res), text_of(res)
    assert nodes_reads(rsim) - before == 3  # a read is retried twice; nothing more
    rsim.set_faults(drop_rate=0)
    breaker.success()
    res = await one(renv, fgw, token, "list_nodes")
    assert not res["isError"], text_of(res)


async def test_offline_node_gives_partial_results_with_a_warning(
    renv: DevEnv, rsim: Any, fgw: GatewayThread, breaker: CircuitBreaker, token: str
) -> None:
    full = await one(renv, fgw, token, "list_storage")
    assert not full["isError"], text_of(full)
    nodes = {row["node"] for row in full["structuredContent"]["items"]}
    assert len(nodes) >= 2
    down = sorted(nodes)[0]
    rsim.set_faults(offline_nodes=[down])
    fgw.components.targets.invalidate("default")  # do not wait for the 5 s target cache
    part = await one(renv, fgw, token, "list_storage")
    assert not part["isError"], text_of(part)
    sc = part["structuredContent"]
    assert {row["node"] for row in sc["items"]} == nodes - {down}
    assert any(down in w for w in sc.get("warnings", [])), sc.get("warnings")
