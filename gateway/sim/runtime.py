"""Everything one running simulator shares: state, schema, ACLs, faults, tasks, logs."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.sim.auth import Acl
from gateway.sim.faults import Faults
from gateway.sim.scenario import Scenario
from gateway.sim.schema import Schema
from gateway.sim.state import Cluster
from gateway.sim.tasks import TaskManager

LOG_CAP = 100_000  # bounded so a benchmark cannot exhaust memory


@dataclass
class Runtime:
    cluster: Cluster
    schema: Schema
    acl: Acl
    faults: Faults
    tasks: TaskManager
    requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=LOG_CAP))
    ssh: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=LOG_CAP))
    started: float = field(default_factory=time.time)

    def node_online(self, name: str) -> bool:
        n = self.cluster.nodes.get(name)
        return bool(n and n.online and name not in self.faults.offline_nodes)

    def task_seconds(self) -> float:
        if self.faults.task_seconds is not None:
            return float(self.faults.task_seconds)
        return self.cluster.task_seconds


def build_runtime(scenario: Scenario, schema_dir: Path | None) -> Runtime:
    cl = scenario.cluster
    faults = Faults()
    faults.update(scenario.faults)
    rt_holder: list[Runtime] = []
    tasks = TaskManager(cl, lambda: rt_holder[0].task_seconds())
    rt = Runtime(cluster=cl, schema=Schema.load(schema_dir, cl.major), acl=Acl(cl), faults=faults, tasks=tasks)
    rt_holder.append(rt)
    return rt
