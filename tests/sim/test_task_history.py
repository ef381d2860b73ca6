"""The simulator's task history is bounded: a soak or a benchmark must not grow it without end."""

from __future__ import annotations

import asyncio

from gateway.sim.scenario import load_scenario
from gateway.sim.tasks import TaskManager


async def test_finished_tasks_rotate_out_and_running_ones_stay() -> None:
    cluster = load_scenario("small").cluster
    cluster.tasks.clear()
    node = next(iter(cluster.nodes))
    manager = TaskManager(cluster, lambda: 0.0, history=10)
    running = manager.start(node, "qmstart", "100", "root@pam", lambda: None, seconds=60)
    first = manager.start(node, "qmstart", "101", "root@pam", lambda: None, seconds=0)
    await asyncio.sleep(0.05)
    assert first.status == "stopped"
    for i in range(30):
        manager.start(node, "qmstart", str(200 + i), "root@pam", lambda: None, seconds=0)
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    assert len(cluster.tasks) <= 10
    assert running.upid in cluster.tasks  # never dropped while it runs
    assert first.upid not in cluster.tasks  # the oldest finished went first
    newest = list(cluster.tasks)[-1]
    assert cluster.tasks[newest].id == "229"
    manager.stop(running.upid)
