"""Runtime fault injection: latency, error rates, dropped connections, offline nodes, slow tasks."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Faults:
    latency_ms: float = 0.0  # added to every matching API request
    latency_path: str | None = None  # regex on the path after /api2/json; None: all paths
    error_rate: float = 0.0  # 0..1 share of matching requests that fail
    error_status: int = 500  # 500 | 595 | 596
    error_path: str | None = None
    drop_rate: float = 0.0  # 0..1 share of matching requests whose connection is cut mid-response
    drop_path: str | None = None
    offline_nodes: list[str] = field(default_factory=list)  # forced offline at runtime
    task_seconds: float | None = None  # overrides the scenario's task duration ("slow task")
    # delay the answer AFTER the request was carried out (a mutation runs; its answer comes late or never)
    answer_delay_ms: float = 0.0
    answer_delay_path: str | None = None
    ssh_latency_ms: float = 0.0
    # regex on an SSH command line (without a `timeout` prefix): a matching command hangs until the fault
    # no longer matches it or `timeout` kills it (df on a dead NFS mount)
    ssh_hang: str | None = None
    seed: int | None = None
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def update(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            if k.startswith("_") or not hasattr(self, k):
                raise ValueError(f"unknown fault '{k}'")
            setattr(self, k, v)
        for pat in (self.latency_path, self.error_path, self.drop_path, self.answer_delay_path, self.ssh_hang):
            if pat:
                re.compile(pat)
        if self.seed is not None:
            self._rng.seed(self.seed)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    @staticmethod
    def _hit(pattern: str | None, path: str) -> bool:
        return pattern is None or re.search(pattern, path) is not None

    def latency_for(self, path: str) -> float:
        return self.latency_ms / 1000 if self.latency_ms and self._hit(self.latency_path, path) else 0.0

    def answer_delay_for(self, path: str) -> float:
        return self.answer_delay_ms / 1000 if self.answer_delay_ms and self._hit(self.answer_delay_path, path) else 0.0

    def ssh_hangs(self, command: str) -> bool:
        try:
            return self.ssh_hang is not None and re.search(self.ssh_hang, command) is not None
        except re.error:  # a bad pattern hangs nothing
            return False

    def error_for(self, path: str) -> int | None:
        if self.error_rate and self._hit(self.error_path, path) and self._rng.random() < self.error_rate:
            return int(self.error_status)
        return None

    def drop_for(self, path: str) -> bool:
        return bool(self.drop_rate and self._hit(self.drop_path, path) and self._rng.random() < self.drop_rate)


FAULT_MESSAGES = {
    500: "simulated internal error",
    595: "Errors during connection establishment, proxy handshake: Connection refused",
    596: "Connection timed out",
}
