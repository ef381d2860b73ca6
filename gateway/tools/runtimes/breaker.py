"""A per-cluster circuit breaker for the Proxmox API.

When a cluster's API stops answering (connection refused or cut, timeouts, 5xx
from the API node itself), every call would otherwise wait for its full timeout
and pile up. After `threshold` consecutive failures the circuit opens: calls fail
at once with a clear tool error. After `cooldown` seconds one probe request is let
through (half-open); its success closes the circuit, its failure re-opens it.

What counts as a failure is deliberately narrow: 595/596 say one *node* is out of
reach of a healthy API node (the rest of the cluster still works), and 4xx are
answers, not outages; neither trips the breaker.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.tools.runtimes.base import UpstreamError
from gateway.tools.runtimes.transport import AnswerMissing, NotSent, Reply

NODE_UNREACHABLE = frozenset({595, 596, 597, 599})  # PVE proxy statuses: a node, not the cluster


class CircuitOpen(UpstreamError):
    """The cluster's circuit is open: the call was refused without contacting Proxmox."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "circuit_open")


def is_outage(status: int) -> bool:
    return status >= 500 and status not in NODE_UNREACHABLE and status != 501


@dataclass
class CircuitBreaker:
    cluster: str
    threshold: int = 5
    cooldown: float = 5.0
    clock: Callable[[], float] = time.monotonic
    state: str = "closed"  # closed | open | half_open
    failures: int = 0
    opened_at: float = 0.0
    opens: int = 0  # how often the circuit opened (for tests and metrics)
    last_error: str | None = None  # the client's wording of the latest failure: why the circuit is open
    _probing: bool = field(default=False, repr=False)

    def before(self) -> None:
        """Raise CircuitOpen unless a request may go out now."""
        if self.state == "closed":
            return
        waited = self.clock() - self.opened_at
        if self.state == "open" and waited >= self.cooldown and not self._probing:
            self.state = "half_open"
            self._probing = True  # exactly one probe; the rest keep failing fast
            return
        retry = max(0.0, self.cooldown - waited)
        cause = f"; last error: {self.last_error}" if self.last_error else ""
        raise CircuitOpen(
            f"Proxmox cluster {self.cluster} is failing ({self.failures} consecutive errors); "
            f"requests are paused, next attempt in about {retry:.0f}s{cause}"
        )

    def success(self) -> None:
        self.state, self.failures, self._probing, self.last_error = "closed", 0, False, None

    def failure(self) -> None:
        self.failures += 1
        self._probing = False
        if self.state == "half_open" or self.failures >= self.threshold:
            if self.state != "open":
                self.opens += 1
            self.state = "open"
            self.opened_at = self.clock()

    async def call(self, send: Callable[[], Awaitable[Reply]]) -> Reply:
        """Send one request through the breaker; transport errors are re-raised after counting."""
        self.before()
        try:
            response = await send()
        except (NotSent, AnswerMissing):
            self.failure()
            raise
        except BaseException:
            self._probing = False  # cancelled or unexpected: neither proof of health nor of outage
            if self.state == "half_open":
                self.state = "open"
            raise
        if is_outage(response.status):
            self.failure()
        else:
            self.success()
        return response
