"""The circuit breaker's probe answer is asked fresh, never taken from a probe long finished.

The breaker shares one probe (the gateway's GET /version) among the callers waiting on it at the
same time, and forgot it only when a waiter saw it finish. When every waiter left before the
probe ended (the client went away, a composite's deadline cancelled the sub-call), the finished
probe stayed behind, and the next time the breaker needed a probe, minutes or hours later, it was
handed that old answer without asking: an old "the API answers" kept the circuit closed (or closed
an open one) while the API was down, and an old "no answer" opened it while the API was up.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.tools.runtimes.breaker import CircuitBreaker, CircuitOpen
from gateway.tools.runtimes.transport import NotSent, Reply


async def test_a_probe_whose_waiters_left_is_not_reused_later() -> None:
    answers: list[bool] = []
    release = asyncio.Event()
    asked = 0

    async def probe() -> bool:
        nonlocal asked
        asked += 1
        if asked == 1:
            await release.wait()  # the first probe is slow: its only waiter leaves before it ends
        return answers[asked - 1]

    async def refused() -> Reply:
        raise NotSent("connection refused")

    b = CircuitBreaker("default", threshold=1, cooldown=60.0, probe=probe)
    answers[:] = [True, False]  # the API answered then; it is down by the next failure
    waiter = asyncio.ensure_future(b.call(refused))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await asyncio.sleep(0.01)  # the first probe ends, with no one waiting on it

    with pytest.raises(NotSent):
        await b.call(refused)  # the threshold again: a new probe must be asked, and it fails
    assert asked == 2, "the old probe's answer was reused instead of asking again"
    assert b.state == "open"
    with pytest.raises(CircuitOpen):
        await b.call(refused)
