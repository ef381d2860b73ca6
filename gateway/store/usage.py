"""Usage counters for quotas: how often a principal called a tool in recent windows.

The counters are facts for the policy; the limits themselves live in Rego data.
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections import defaultdict

WINDOWS = {"1m": 60.0, "1h": 3600.0, "24h": 86400.0}


class UsageCounters:
    def __init__(self) -> None:
        # array('d'): 8 bytes per kept call instead of ~20 in a list of floats (24 h are kept)
        self._calls: dict[tuple[str, str], array[float]] = defaultdict(lambda: array("d"))

    def _prune(self, key: tuple[str, str], now: float) -> array[float]:
        times = self._calls[key]
        cut = bisect.bisect_left(times, now - WINDOWS["24h"])
        if cut:
            del times[:cut]
        return times

    def counts(self, principal: str, tool: str, now: float | None = None) -> dict[str, dict[str, int]]:
        now = time.time() if now is None else now
        out: dict[str, dict[str, int]] = {}
        for scope, key in (("tool", (principal, tool)), ("all", (principal, "*"))):
            times = self._prune(key, now)
            out[scope] = {name: len(times) - bisect.bisect_left(times, now - span) for name, span in WINDOWS.items()}
        return out

    def record(self, principal: str, tool: str, when: float | None = None) -> None:
        when = time.time() if when is None else when
        for key in ((principal, tool), (principal, "*")):
            bisect.insort(self._calls[key], when)

    def reserve(self, principal: str, tool: str) -> tuple[dict[str, dict[str, int]], float]:
        """Read the counts and take a slot in one step (no await in between), so concurrent
        calls each see the ones before them; a quota cannot be raced past."""
        now = time.time()
        counts = self.counts(principal, tool, now)
        self.record(principal, tool, now)
        return counts, now

    def release(self, principal: str, tool: str, when: float) -> None:
        """Give back a slot taken by reserve() for a call that was denied."""
        for key in ((principal, tool), (principal, "*")):
            times = self._calls[key]
            i = bisect.bisect_left(times, when)
            if i < len(times) and times[i] == when:
                del times[i]

    def load(self, calls: list[tuple[float, str, str]]) -> None:
        """Seed the counters with (time, principal, tool) of calls executed before a restart."""
        for when, principal, tool in sorted(calls):
            self.record(principal, tool, when)
