"""Quota windows (SQLite backend: this process's counters) were measured on the wall clock.

`UsageCounters` stamped each reserved call with time.time() and counted a window as the calls
stamped after `now - span`. A wall clock stepped (NTP correcting a drifted host, a VM resumed
from a snapshot, an operator fixing the date) moved every window with it:

- stepped forward, the calls just made fell out of the 1 m and 1 h windows at once: a principal
  that had used its quota got it whole again a second later (the quota raced past);
- stepped back, the calls made before the step were "in the future" and counted in every window
  until the clock caught up: a principal's 10-per-minute quota stayed spent for as long as the
  step (an hour's step: an hour of denials for calls made a minute ago).

The windows now run on the monotonic clock (as the pool holds' TTL does); the audit's wall-clock
stamps read at start are placed on it by their age.
"""

from __future__ import annotations

import types

import pytest

from gateway.store import usage as usage_module
from gateway.store.usage import UsageCounters


class Clocks:
    """The two clocks the counters may read: `wall` steps, `mono` only moves forward with real time."""

    def __init__(self) -> None:
        self.wall = 1_750_000_000.0
        self.mono = 5_000.0

    def elapse(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    c = Clocks()
    fake = types.SimpleNamespace(time=lambda: c.wall, monotonic=lambda: c.mono)
    monkeypatch.setattr(usage_module, "time", fake)  # usage.py's clocks only, not the event loop's
    return c


def test_a_forward_step_does_not_empty_the_windows(clocks: Clocks) -> None:
    usage = UsageCounters()
    for _ in range(10):
        usage.reserve("agent", "vm_reboot")
    clocks.elapse(1.0)
    clocks.wall += 7200.0  # the host's clock was two hours behind: corrected
    counts, _ = usage.reserve("agent", "vm_reboot")
    assert counts["tool"]["1m"] == 10  # made a second ago: still in the minute
    assert counts["all"]["1h"] == 10


def test_a_backward_step_does_not_keep_calls_in_every_window(clocks: Clocks) -> None:
    usage = UsageCounters()
    for _ in range(10):
        usage.reserve("agent", "vm_reboot")
    clocks.wall -= 3600.0  # the host's clock was an hour ahead: corrected
    clocks.elapse(120.0)  # two minutes later
    counts, _ = usage.reserve("agent", "vm_reboot")
    assert counts["tool"]["1m"] == 0  # made two minutes ago: out of the minute
    assert counts["tool"]["1h"] == 10
    assert counts["all"]["24h"] == 10


def test_calls_read_from_the_audit_at_start_keep_their_age(clocks: Clocks) -> None:
    usage = UsageCounters()
    now = clocks.wall
    usage.load([(now - 30.0, "agent", "vm_reboot"), (now - 600.0, "agent", "vm_reboot"), (now - 9e4, "agent", "x")])
    counts = usage.counts("agent", "vm_reboot")
    assert counts["tool"] == {"1m": 1, "1h": 2, "24h": 2}
    assert counts["all"] == {"1m": 1, "1h": 2, "24h": 2}  # the one older than a day is not counted
    clocks.elapse(45.0)
    assert usage.counts("agent", "vm_reboot")["tool"] == {"1m": 0, "1h": 2, "24h": 2}


def test_a_released_slot_is_given_back_once(clocks: Clocks) -> None:
    usage = UsageCounters()
    _, a = usage.reserve("agent", "vm_reboot")
    _, b = usage.reserve("agent", "vm_reboot")  # the same instant: two slots, one stamp
    usage.release("agent", "vm_reboot", b)
    counts, _ = usage.reserve("agent", "vm_reboot")
    assert counts["tool"]["1m"] == 1 and counts["all"]["1m"] == 1
    assert a == b
