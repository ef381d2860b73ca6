"""The per-cluster circuit breaker on its own, with a fake clock."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from gateway.tools.runtimes.breaker import CircuitBreaker, CircuitOpen, failure_kind, is_outage
from gateway.tools.runtimes.transport import AnswerMissing, NotSent, Reply


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

    opened = r"cluster c1 is failing \(3 consecutive failures: 3 connection failures\).* next attempt in about 5s"
    with pytest.raises(CircuitOpen, match=opened):
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


@pytest.mark.parametrize("status", [200, 400, 403, 404, 500, 501, 595, 596, 597, 599])
async def test_answers_and_node_faults_do_not_trip(status: int) -> None:
    # 500 is Proxmox's answer to an ordinary request error ("storage 'x' does not exist"): any
    # caller can provoke it, and the breaker is shared by every principal of the cluster
    b = CircuitBreaker("c1", threshold=2)
    for _ in range(5):
        await send_status(b, status)
    assert b.state == "closed"


@pytest.mark.parametrize("status", [502, 503, 504, 598])
async def test_api_node_errors_trip(status: int) -> None:
    b = CircuitBreaker("c1", threshold=2)
    await send_status(b, status)
    await send_status(b, status)
    assert b.state == "open"


async def test_success_resets_the_count() -> None:
    b = CircuitBreaker("c1", threshold=2)
    await send_status(b, 503)
    await send_status(b, 200)
    await send_status(b, 503)
    assert b.state == "closed"


async def test_a_500_answer_resets_the_count() -> None:
    """A 500 proves the API answered: it is no failure, and ends a run of them."""
    b = CircuitBreaker("c1", threshold=2)
    await send_status(b, 503)
    await send_status(b, 500)
    await send_status(b, 503)
    assert b.state == "closed" and b.failures == 1


@pytest.mark.parametrize(
    ("status", "outage"),
    [
        *[(s, False) for s in (200, 404, 500, 501, 595, 596, 597, 599)],
        *[(s, True) for s in (502, 503, 504, 505, 598)],
    ],
)
def test_is_outage_classification(status: int, outage: bool) -> None:
    assert is_outage(status) is outage


def test_failure_kinds_carry_no_upstream_text() -> None:
    refused = NotSent("Cannot connect to host secret-host:8006 ssl:default [Connect call failed]")
    refused.__cause__ = ConnectionRefusedError(111, "Connection refused")
    assert failure_kind(refused) == "connection refused"
    assert failure_kind(NotSent("anything", timeout=True)) == "connect timeouts"
    tls = NotSent("x")
    tls.__cause__ = ssl.SSLError("bad cert")
    assert failure_kind(tls) == "TLS failures"
    assert failure_kind(NotSent("Name or service not known")) == "connection failures"
    assert failure_kind(AnswerMissing("read timeout", timeout=True)) == "timeouts waiting for an answer"
    assert failure_kind(AnswerMissing("ServerDisconnectedError")) == "dropped connections"


async def test_open_message_names_counts_and_kinds_not_upstream_text() -> None:
    clock = Clock()
    b = CircuitBreaker("c1", threshold=3, cooldown=5.0, clock=clock)

    async def refused() -> Reply:
        exc = NotSent("Cannot connect to host mallory-secret-text")
        exc.__cause__ = ConnectionRefusedError(111, "Connection refused")
        raise exc

    for _ in range(2):
        with pytest.raises(NotSent):
            await b.call(refused)

    async def unavailable() -> Reply:
        return Reply(503, "mallory-secret-reason", b'{"message": "mallory-secret-message"}')

    await b.call(unavailable)
    assert b.state == "open"
    with pytest.raises(CircuitOpen) as err:
        b.before()
    text = str(err.value)
    assert "3 consecutive failures: 2 connection refused, 1 HTTP 503 answers" in text, text
    assert "mallory" not in text
    b.success()
    assert b.kinds == {} and b.failures == 0


class Probe:
    """The gateway's own request, answering as told; counts how often it was asked."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.asked = 0
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> bool:
        self.asked += 1
        if self.gate is not None:
            await self.gate.wait()
        return self.answers


async def test_with_a_probe_that_answers_callers_failures_do_not_open() -> None:
    """Timeouts a caller chose (a slow read) reach the threshold; the API answers the gateway's probe,
    so the count starts again and the circuit stays closed."""
    probe = Probe(answers=True)
    b = CircuitBreaker("c1", threshold=3, probe=probe)
    for _ in range(7):
        await send_error(b)
    assert b.state == "closed" and b.opens == 0 and probe.asked == 2 and b.confirmed == 2 and b.failures == 1


async def test_with_a_probe_that_fails_the_circuit_opens() -> None:
    probe = Probe(answers=False)
    b = CircuitBreaker("c1", threshold=3, probe=probe)
    for _ in range(3):
        await send_error(b)
    assert b.state == "open" and b.opens == 1 and probe.asked == 1


async def test_failures_at_once_ask_the_probe_once() -> None:
    probe = Probe(answers=False)
    probe.gate = asyncio.Event()
    b = CircuitBreaker("c1", threshold=2, probe=probe)
    waiting = [asyncio.ensure_future(send_error(b)) for _ in range(4)]
    await asyncio.sleep(0.01)
    probe.gate.set()
    await asyncio.gather(*waiting)
    assert probe.asked == 1 and b.state == "open" and b.opens == 1


async def test_once_open_the_probe_not_a_caller_decides_when_it_closes() -> None:
    clock = Clock()
    probe = Probe(answers=False)
    b = CircuitBreaker("c1", threshold=1, cooldown=2.0, clock=clock, probe=probe)
    await send_error(b)
    assert b.state == "open"
    sent: list[int] = []

    async def send() -> Reply:
        sent.append(1)
        return response(200)

    clock.now += 2.0
    with pytest.raises(CircuitOpen):  # the probe failed: the caller's request never went out
        await b.call(send)
    assert sent == [] and b.state == "open" and probe.asked == 2
    with pytest.raises(CircuitOpen):  # a new cooldown began with the failed probe
        await b.call(send)
    assert probe.asked == 2
    clock.now += 2.0
    probe.answers = True
    assert (await b.call(send)).status == 200
    assert sent == [1] and b.state == "closed" and b.failures == 0


async def test_a_caller_leaving_while_the_probe_runs_leaves_the_circuit_to_the_next() -> None:
    clock = Clock()
    probe = Probe(answers=True)
    b = CircuitBreaker("c1", threshold=1, cooldown=2.0, clock=clock, probe=Probe(answers=False))
    await send_error(b)
    b.probe = probe
    probe.gate = asyncio.Event()
    clock.now += 2.0
    first = asyncio.ensure_future(send_status(b, 200))
    await asyncio.sleep(0.01)
    with pytest.raises(CircuitOpen):  # the others fail fast while it is asked
        await send_status(b, 200)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert b.state == "open"  # not stuck half-open: the next caller asks
    probe.gate.set()
    assert (await send_status(b, 200)).status == 200
    assert b.state == "closed" and probe.asked == 1  # the probe already under way was answered once
