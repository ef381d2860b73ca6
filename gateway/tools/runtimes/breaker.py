"""A per-cluster circuit breaker for the Proxmox API.

When a cluster's API stops answering (connection refused or cut, timeouts, a proxy or
availability status), every call would otherwise wait for its full timeout and pile up. After
`threshold` consecutive failures the circuit opens: calls fail at once with a clear tool error.
After `cooldown` seconds one probe request is let through (half-open); its success closes the
circuit, its failure re-opens it.

The breaker is one per cluster, shared by every principal, so what counts as a failure is
deliberately narrow: only what says the API itself is out of reach. That is a transport failure
(nothing sent, no whole answer, a timeout) or a status that a proxy or an overloaded server gives
instead of an answer: 502, 503, 504 and the other 5xx (598 among them). Not failures, because
the API did answer:

- 500: Proxmox's answer to an ordinary request error ("storage 'x' does not exist", "VM is
  locked", "config file does not exist"). Any caller can provoke it at will, so counting it
  would let one principal pause the cluster for all the others;
- 501: an endpoint this Proxmox version does not implement;
- 595/596/597/599: pveproxy could not reach one *node*; the rest of the cluster still works;
- 4xx: answers about the request.

A transport failure can be provoked too: a principal that asks for a read Proxmox is slow to
answer (a large listing, a path a proxy stalls on) gets timeouts of its own choosing. So, given a
`probe` (the gateway's own GET /version), the breaker does not trust its callers' requests to say
the API is down or back: on reaching the threshold it asks the probe first, and opens only when
the probe fails too (when it answers, the failures were the requests' own and the count starts
again); once open, the probe, not a caller's request, decides when it closes. Without a probe
(its unit tests) the callers' requests count and probe as described above.

The fail-fast message says how many consecutive failures of which kinds opened the circuit
("connection refused", "timeouts waiting for an answer", "HTTP 503 answers"); never any call's upstream
text, which would carry one principal's error into another's reply and audit row.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.tools.runtimes.base import UpstreamError
from gateway.tools.runtimes.transport import AnswerMissing, NotSent, Reply

NODE_UNREACHABLE = frozenset({595, 596, 597, 599})  # PVE proxy statuses: a node, not the cluster
# 5xx that are the API's answer to the request, not a sign that it is down (see the module doc)
ANSWERED = frozenset({500, 501}) | NODE_UNREACHABLE


class CircuitOpen(UpstreamError):
    """The cluster's circuit is open: the call was refused without contacting Proxmox."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "circuit_open")


def is_outage(status: int) -> bool:
    """Whether an HTTP status says the cluster's API is out of reach (counts toward opening)."""
    return status >= 500 and status not in ANSWERED


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen and len(seen) < 16:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def failure_kind(exc: BaseException) -> str:
    """A fixed, short name for a transport failure: no upstream text, only its kind."""
    if isinstance(exc, NotSent):
        if exc.timeout:
            return "connect timeouts"
        chain = _chain(exc)
        if any(isinstance(e, ssl.SSLError) for e in chain):
            return "TLS failures"
        if any(isinstance(e, ConnectionRefusedError) for e in chain):
            return "connection refused"
        return "connection failures"
    if isinstance(exc, AnswerMissing):
        return "timeouts waiting for an answer" if exc.timeout else "dropped connections"
    return "transport errors"


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
    # the kinds of the consecutive failures (failure_kind, or "HTTP <status>"), counted: why the
    # circuit is open, in words that carry no call's upstream text. At most a handful of keys.
    kinds: dict[str, int] = field(default_factory=dict)
    # the gateway's own request (True: the API answered), which alone opens and closes the circuit
    probe: Callable[[], Awaitable[bool]] | None = field(default=None, repr=False)
    confirmed: int = 0  # how often the probe answered when callers' failures reached the threshold
    _probing: bool = field(default=False, repr=False)
    _asking: asyncio.Future[bool] | None = field(default=None, repr=False)

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
        raise CircuitOpen(
            f"Proxmox cluster {self.cluster} is failing ({self.describe()}); "
            f"requests are paused, next attempt in about {retry:.0f}s"
        )

    def describe(self) -> str:
        """e.g. "5 consecutive failures: 3 connection refused, 2 timeouts waiting for an answer"."""
        what = ", ".join(f"{n} {kind}" for kind, n in sorted(self.kinds.items(), key=lambda kv: (-kv[1], kv[0])))
        plural = "" if self.failures == 1 else "s"
        return f"{self.failures} consecutive failure{plural}" + (f": {what}" if what else "")

    def success(self) -> None:
        self.state, self.failures, self._probing = "closed", 0, False
        self.kinds = {}

    def failure(self, kind: str = "errors") -> None:
        self._count(kind)
        self._probing = False
        if self.state == "half_open" or self.failures >= self.threshold:
            self._open()

    def _count(self, kind: str) -> None:
        self.failures += 1
        if kind in self.kinds or len(self.kinds) < 8:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def _open(self) -> None:
        if self.state != "open":
            self.opens += 1
        self.state = "open"
        self.opened_at = self.clock()

    async def call(self, send: Callable[[], Awaitable[Reply]]) -> Reply:
        """Send one request through the breaker; transport errors are re-raised after counting."""
        if self.probe is not None:
            await self._admit()
        else:
            self.before()
        try:
            response = await send()
        except (NotSent, AnswerMissing) as exc:
            if isinstance(exc, NotSent) and exc.busy:  # the gateway's own pool was full: the API was not asked
                self._probing = False
                if self.state == "half_open":
                    self.state = "open"
                raise
            await self._failed(failure_kind(exc))
            raise
        except BaseException:
            self._probing = False  # cancelled or unexpected: neither proof of health nor of outage
            if self.state == "half_open":
                self.state = "open"
            raise
        if is_outage(response.status):
            await self._failed(f"HTTP {response.status} answers")
        else:
            self.success()  # the API answered (a 500 about the request is an answer too)
        return response

    async def _admit(self) -> None:
        """before(), with the gateway's probe in place of a caller's request once the cooldown is over:
        one caller asks it while the others fail fast; its answer closes the circuit (and that
        caller's request goes out), its failure keeps it open for another cooldown."""
        self.before()
        if self.state != "half_open":
            return
        try:
            answered = await self._ask()
        except BaseException:  # the caller left: the next one after the cooldown asks (the same probe)
            self.state, self._probing = "open", False
            raise
        if answered:
            self.success()
            return
        self.failure("failed probes")
        self.before()  # raises CircuitOpen: open again, for another cooldown

    async def _failed(self, kind: str) -> None:
        """Count a caller's failure; one that reaches the threshold opens the circuit only if the
        probe (when there is one) fails too."""
        if self.probe is None or self.state != "closed":
            self.failure(kind)
            return
        self._count(kind)
        if self.failures < self.threshold:
            return
        if await self._ask():  # concurrent failures wait for the same answer
            # the API answers the gateway: these were the requests' own failures (a slow read a
            # caller chose), which must not pause the cluster for every other principal
            if self.state == "closed" and self.failures:
                self.confirmed += 1
                self.success()
        elif self.state == "closed":
            self._open()

    async def _ask(self) -> bool:
        """The probe's answer, asked once for every caller waiting on it at the same time."""
        assert self.probe is not None
        # a finished probe no waiter collected (they all left before it ended) is an old answer: ask again
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self._probe_once(self.probe))
        asking = self._asking
        try:
            return await asyncio.shield(asking)
        finally:
            if asking.done() and self._asking is asking:
                self._asking = None

    @staticmethod
    async def _probe_once(probe: Callable[[], Awaitable[bool]]) -> bool:
        try:
            return await probe()
        except Exception:  # no answer is a failed probe
            return False
