"""The per-cluster circuit breaker is shared by every principal: what one principal can provoke
at will (Proxmox answering 500 to a request error, timeouts on a read it knows to be slow) must
not pause the cluster for the others, and the fail-fast message must not carry another call's
upstream text."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.breaker import CircuitBreaker
from tests.resilience.helpers import call, client, fresh_config, result_of, text_of, url_of
from tests.support import GatewayThread


@pytest.fixture(scope="module")
def sgw(renv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(fresh_config(renv, "breaker-shared")).start()
    yield gw
    gw.stop()


@pytest.fixture
def breaker(sgw: GatewayThread) -> CircuitBreaker:
    b: CircuitBreaker = sgw.components.runtimes["pve_api"].clients["default"].breaker  # type: ignore[attr-defined]
    b.success()
    b.cooldown = 30.0  # an open circuit stays open for the whole test
    return b


async def one(renv: DevEnv, gw: GatewayThread, token: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async with client(renv) as http:
        r = await call(http, url_of(gw.config), token, tool, args)
    assert r.status_code == 200, r.text
    return result_of(r)


async def test_one_principals_500_answers_do_not_pause_the_cluster_for_another(
    renv: DevEnv, sgw: GatewayThread, breaker: CircuitBreaker
) -> None:
    mallory = renv.token("breaker-mallory", ["viewer"], kind="service")
    bob = renv.token("breaker-bob", ["viewer"], kind="service")
    for _ in range(2 * breaker.threshold):
        res = await one(renv, sgw, mallory, "list_storage_content", {"node": "pve1", "storage": "nosuchstore"})
        assert res["isError"] and "does not exist" in text_of(res), text_of(res)
        assert "requests are paused" not in text_of(res)
    assert breaker.state == "closed" and breaker.failures == 0
    res = await one(renv, sgw, bob, "list_nodes", {})
    assert not res["isError"], text_of(res)


async def test_an_open_circuit_tells_another_principal_no_upstream_text(
    renv: DevEnv, rsim: Any, sgw: GatewayThread, breaker: CircuitBreaker
) -> None:
    mallory = renv.token("breaker-mallory", ["viewer"], kind="service")
    bob = renv.token("breaker-bob", ["viewer"], kind="service")
    rsim.set_faults(error_rate=1.0, error_status=503, error_path="^/(nodes|version)$")  # the API, not a read
    for _ in range(breaker.threshold):
        res = await one(renv, sgw, mallory, "list_nodes", {})
        assert res["isError"] and "Proxmox answered 503: simulated error" in text_of(res), text_of(res)
    assert breaker.state == "open"
    res = await one(renv, sgw, bob, "list_nodes", {})
    text = text_of(res)
    assert res["isError"] and "requests are paused" in text, text
    assert f"{breaker.threshold} consecutive failures: {breaker.threshold} HTTP 503 answers" in text, text
    assert "simulated error" not in text and "Proxmox answered" not in text, text
    rsim.set_faults(error_rate=0)
    breaker.success()


async def test_one_principals_slow_reads_do_not_pause_the_cluster_for_another(
    renv: DevEnv, rsim: Any, sgw: GatewayThread, breaker: CircuitBreaker
) -> None:
    """Timeouts a principal provokes by choosing a read Proxmox is slow to answer reach the
    threshold; the gateway's own GET /version answers, so the circuit stays closed."""
    mallory = renv.token("breaker-mallory", ["viewer"], kind="service")
    bob = renv.token("breaker-bob", ["viewer"], kind="service")
    slow = {"node": "pve1", "storage": "local"}
    opens, confirmed = breaker.opens, breaker.confirmed
    rsim.set_faults(latency_ms=20000, latency_path="^/nodes/pve1/storage/local/content$")  # beyond the 1.5 s timeout
    try:  # three attempts each: six timeouts, over the threshold of five
        results = await asyncio.gather(*(one(renv, sgw, mallory, "list_storage_content", slow) for _ in range(2)))
    finally:
        rsim.set_faults(latency_ms=0, latency_path=None)
    for res in results:
        assert res["isError"] and "did not answer in time" in text_of(res), text_of(res)
    assert breaker.state == "closed" and breaker.opens == opens and breaker.confirmed > confirmed, breaker
    res = await one(renv, sgw, bob, "list_nodes", {})
    assert not res["isError"], text_of(res)
