"""Usage counters for quotas: how often a principal called a tool in recent windows.

The counters are facts for the policy; the limits themselves live in Rego data. On SQLite
they are this process's (`MemoryQuotas`, as before); on PostgreSQL they are rows every replica
counts (`SqlQuotas`), so a limit of 10 lets 10 calls through whichever replicas they reach.
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

from gateway.core.config import Config
from gateway.store.audit import AuditLog
from gateway.store.db import Database, database
from gateway.store.migrations import check

WINDOWS = {"1m": 60.0, "1h": 3600.0, "24h": 86400.0}


class UsageCounters:
    """Calls per (principal, tool) and (principal, "*"), stamped on the monotonic clock: a wall clock
    stepped forward would empty the windows (a spent quota whole again), one stepped back would keep
    the calls before the step in every window until it caught up (the pool holds' TTL runs on it too)."""

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
        now = time.monotonic() if now is None else now
        out: dict[str, dict[str, int]] = {}
        for scope, key in (("tool", (principal, tool)), ("all", (principal, "*"))):
            times = self._prune(key, now)
            out[scope] = {name: len(times) - bisect.bisect_left(times, now - span) for name, span in WINDOWS.items()}
        return out

    def record(self, principal: str, tool: str, when: float | None = None) -> None:
        when = time.monotonic() if when is None else when
        for key in ((principal, tool), (principal, "*")):
            bisect.insort(self._calls[key], when)

    def reserve(self, principal: str, tool: str) -> tuple[dict[str, dict[str, int]], float]:
        """Read the counts and take a slot in one step (no await in between), so concurrent
        calls each see the ones before them; a quota cannot be raced past."""
        now = time.monotonic()
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
        """Seed the counters with (time, principal, tool) of calls executed before a restart: wall-clock
        stamps (the audit's), placed on the monotonic clock by their age; one stamped after now (the
        clock stepped back since) counts as made now."""
        wall, mono = time.time(), time.monotonic()
        for when, principal, tool in sorted(calls):
            self.record(principal, tool, mono - max(wall - when, 0.0))


Counts = dict[str, dict[str, int]]


class Quotas(Protocol):
    """Where the pipeline takes a quota slot before asking OPA and gives it back on a deny.

    `reserve` reads the counts and takes a slot in one step: concurrent calls, on this process
    or (PostgreSQL) any replica, each see every call before them, so a limit cannot be raced past.
    """

    async def reserve(self, principal: str, tool: str) -> tuple[Counts, float]: ...
    async def release(self, principal: str, tool: str, slot: float) -> None: ...
    async def close(self) -> None: ...


class MemoryQuotas:
    """One process's counters (the SQLite backend: one gateway process per database file),
    re-read at start from the audit's last 24 hours of executed calls."""

    def __init__(self, counters: UsageCounters | None = None) -> None:
        self.counters = counters or UsageCounters()

    async def reserve(self, principal: str, tool: str) -> tuple[Counts, float]:
        return self.counters.reserve(principal, tool)  # no await inside: atomic on the event loop

    async def release(self, principal: str, tool: str, slot: float) -> None:
        self.counters.release(principal, tool, slot)

    def counts(self, principal: str, tool: str) -> Counts:
        """The current counts, without taking a slot (operators and tests look)."""
        return self.counters.counts(principal, tool)

    async def close(self) -> None:
        return None


SQLITE_V1 = """
CREATE TABLE IF NOT EXISTS usage_events (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    principal TEXT NOT NULL,
    tool      TEXT NOT NULL,
    at        REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_by_principal ON usage_events(principal, at)
"""
POSTGRES_V1 = """
CREATE TABLE IF NOT EXISTS usage_events (
    id        BIGSERIAL PRIMARY KEY,
    principal TEXT NOT NULL,
    tool      TEXT NOT NULL,
    at        DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS usage_by_principal ON usage_events(principal, at)
"""
MIGRATIONS: dict[str, Sequence[str]] = {"sqlite": [SQLITE_V1], "postgresql": [POSTGRES_V1]}

_COUNTS = ", ".join(
    f"COALESCE(SUM(CASE WHEN tool = ? AND at >= ? THEN 1 ELSE 0 END), 0) AS tool_{name}, "
    f"COALESCE(SUM(CASE WHEN at >= ? THEN 1 ELSE 0 END), 0) AS all_{name}"
    for name in WINDOWS
)


# Rows are inserted in id order on the database's clock, so the lapsed ones are the lowest ids: a reservation
# looks at the SWEEP_BATCH oldest (an index scan of that many rows, never the table) and deletes those past
# every window. Each reservation adds one row and may sweep a batch, so the table keeps to its last 24 hours.
# On PostgreSQL rows another replica's transaction holds are skipped, never waited for (no lock-order deadlock
# with a reservation pruning its own principal's rows).
SWEEP_BATCH = 100
_SWEEP = (
    "DELETE FROM usage_events WHERE id IN (SELECT id FROM usage_events WHERE id IN "  # noqa: S608 - constants only
    f"(SELECT id FROM usage_events ORDER BY id LIMIT {SWEEP_BATCH}) AND at < ?{{lock}})"
)


class SqlQuotas:
    """Counters shared through the database: one row per reserved call, kept 24 hours.

    A reservation is one transaction holding a lock on the principal (an advisory lock on
    PostgreSQL, the database write lock on SQLite): count, then insert. The database's clock
    is the one time every replica agrees on.
    """

    def __init__(self, database: Database) -> None:
        self.database = database
        self._sweep = _SWEEP.format(lock=" FOR UPDATE SKIP LOCKED" if database.kind == "postgresql" else "")

    async def open(self) -> None:
        await self.database.open()
        try:
            await check(self.database, "usage", MIGRATIONS)
        except BaseException:
            await self.database.close()
            raise

    async def close(self) -> None:
        await self.database.close()

    async def reserve(self, principal: str, tool: str) -> tuple[Counts, float]:
        async with self.database.transaction() as tx:
            await tx.lock(f"usage:{principal}")
            now = await tx.now()
            horizon = now - WINDOWS["24h"]
            # the oldest rows of any principal once they left every window, this principal's among them; one
            # that stopped calling (an agent run's own sub, a retired account) would otherwise stay for ever
            await tx.execute(self._sweep, horizon)
            args: list[Any] = []
            for span in WINDOWS.values():
                args += [tool, now - span, now - span]
            # rows not swept yet are outside every window: the range on the index leaves them unread
            rows = await tx.fetch(
                f"SELECT {_COUNTS} FROM usage_events WHERE principal = ? AND at >= ?",  # noqa: S608 - constants only
                *args,
                principal,
                horizon,
            )
            row = rows[0]
            counts = {scope: {name: int(row[f"{scope}_{name}"]) for name in WINDOWS} for scope in ("tool", "all")}
            ids = await tx.fetch(
                "INSERT INTO usage_events (principal, tool, at) VALUES (?, ?, ?) RETURNING id", principal, tool, now
            )
        return counts, float(ids[0]["id"])

    async def release(self, principal: str, tool: str, slot: float) -> None:
        async with self.database.transaction() as tx:
            await tx.execute(
                "DELETE FROM usage_events WHERE id = ? AND principal = ? AND tool = ?", int(slot), principal, tool
            )


async def build_quotas(config: Config, audit: AuditLog) -> Quotas:
    """The counters storage.url selects: shared rows on PostgreSQL; on SQLite this process's,
    re-read from the audit so that quotas survive a restart (the last 24 h of executed calls)."""
    if config.storage.postgresql:
        quotas = SqlQuotas(database(config))
        await quotas.open()
        return quotas
    counters = UsageCounters()
    counters.load(await audit.allowed_since(time.time() - WINDOWS["24h"]))
    return MemoryQuotas(counters)
