"""The per-cluster circuit breaker on its own, with a fake clock."""

from __future__ import annotations

import pytest

from gateway.tools.runtimes.breaker import CircuitBreaker, CircuitOpen
from gateway.tools.runtimes.transport import NotSent, Reply


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def response(status: int) -> Reply:
    return Reply(status, "", b"{}")


async def send_status(b: CircuitBreaker, status: int) -> Reply:
    async def send() -> Reply:
        return response(status)

    return await b.call(send)


async def send_error(b: CircuitBreaker) -> None:
    async def send() -> Reply:
        raise NotSent("refused")

    with pytest.raises(NotSent):
        await b.call(send)


async def test_opens_after_threshold_and_fails_fast() -> None:
    clock = Clock()
    b = CircuitBreaker("c1", threshold=3, cooldown=5.0, clock=clock)
    for _ in range(2):
        await send_error(b)
    assert b.state == "closed"
    await send_error(b)
    assert b.state == "open" and b.opens == 1
    sent = []

    async def send() -> Reply:
        sent.append(1)
        return response(200)

    with pytest.raises(CircuitOpen, match=r"cluster c1 is failing .* next attempt in about 5s"):
        await b.call(send)
    assert sent == []  # nothing went out while open


async def test_half_open_lets_one_probe_and_closes_on_success() -> None:
    clock = Clock()
    b = CircuitBreaker("c1", threshold=1, cooldown=2.0, clock=clock)
    await send_error(b)
    clock.now += 2.0
    b.before()  # the probe
    assert b.state == "half_open"
    with pytest.raises(CircuitOpen):
        b.before()  # a second caller while the probe is out
    b.success()
    assert b.state == "closed" and b.failures == 0
    assert (await send_status(b, 200)).status == 200


async def test_failed_probe_reopens() -> None:
    clock = Clock()
    b = CircuitBreaker("c1", threshold=1, cooldown=2.0, clock=clock)
    await send_error(b)
    clock.now += 2.5
    await send_status(b, 503)
    assert b.state == "open" and b.opens == 2
    with pytest.raises(CircuitOpen):
        b.before()


@pytest.mark.parametrize("status", [200, 400, 403, 404, 501, 595, 596])
async def test_answers_and_node_faults_do_not_trip(status: int) -> None:
    b = CircuitBreaker("c1", threshold=2)
    for _ in range(5):
        await send_status(b, status)
    assert b.state == "closed"


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_api_node_errors_trip(status: int) -> None:
    b = CircuitBreaker("c1", threshold=2)
    await send_status(b, status)
    await send_status(b, status)
    assert b.state == "open"


async def test_success_resets_the_count() -> None:
    b = CircuitBreaker("c1", threshold=2)
    await send_status(b, 500)
    await send_status(b, 200)
    await send_status(b, 500)
    assert b.state == "closed"
