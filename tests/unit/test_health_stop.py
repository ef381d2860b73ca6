"""The health monitor's shutdown is bounded: a probe loop that swallows its cancellation (as
asyncio.wait_for could on Python 3.11 when the probe finished at that moment) is cancelled again
instead of holding `pvegate serve` past SIGTERM."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.observability.health import HealthMonitor


async def test_stop_cancels_again_a_loop_that_swallowed_its_cancellation() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:
                    raise  # a second cancellation ends it, as in the probe loop after the race

    monitor: Any = HealthMonitor.__new__(HealthMonitor)  # only its task list takes part in stop()
    task = asyncio.create_task(stubborn(), name="health-audit")
    monitor._tasks = [task]
    await asyncio.sleep(0)
    started = time.monotonic()
    await asyncio.wait_for(monitor.stop(), timeout=30)  # before: waited for the task forever
    assert task.done() and swallowed == 2
    assert time.monotonic() - started < 10
