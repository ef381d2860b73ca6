"""Pool holds: what allowed allocating calls still in flight will add to their pool.

A pool's usage is read from Proxmox when a call is decided. Two creates decided at once would
each see the pool without the other and pass its `max_pool_total` together, and a create still
running in Proxmox may not be in the pool yet. So an allocating call the policy allows (to be
sent as it is: no approval to wait for, no dry run) then holds what it asks for on its pool,
reads the pool's usage afresh, and is decided again with what the holds taken before it add
(counted into `resources.pool_usage`, shown as `resources.pool_in_flight`). Only calls allowed
once take holds, so a principal the policy refuses cannot block a pool with them. A call gives
its hold back when it ends with Proxmox's answer (the guest or disk is then in the pool's usage,
or there is none) or is not sent after all (denied the second time). A call whose outcome is
left to reconciliation (interrupted, or still running at its task_timeout) keeps its hold while
reconciliation finds its task running (each pass renews it) and until it settles the call (on
any replica); a call cut off by an error after it was sent keeps it until it lapses.

Because every hold is taken before the usage it is checked against is read, a call either sees
an earlier call's hold or that call's guest: of two calls that fit one at a time but not
together, the later one is refused (an earlier call later denied may cost a later one a refusal
it would not have had: the error is on the safe side).

On SQLite the holds are this process's (one gateway process owns the file); at start it takes
again those of the calls its audit shows still open (Reconciler.read_earlier). On PostgreSQL
they are rows every replica counts, taken under an advisory lock on the pool, on the database's
clock. A replica that dies holding one (a crash, SIGKILL) leaves it to lapse (75 minutes after it was
taken: longer than the longest call, an hour's task wait, and reconciliation's first renewal after
it), or to the reconciliation that settles its calls.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gateway.core.config import Config
from gateway.store.db import Database, database
from gateway.store.migrations import check

log = logging.getLogger("pvegate.holds")

AMOUNTS = ("guests", "cores", "memory_mib", "disk_gib")
Amounts = dict[str, int]

# the longest a call waits on its Proxmox task: the most a connector's task_timeout may be (connector.schema.json;
# the shipped restores and storage_download_url wait that long)
MAX_TASK_WAIT_SECONDS = 3600.0
# how long a hold outlives its taking at most: longer than any call may run (the longest task wait, and around
# it the second decision, the decision's commit, the POST and the result's record) plus the time reconciliation
# needs to find a call still running and renew its hold (its own replica's next pass, or the others' once that
# replica is gone), so a hold never lapses while its call can still be running
DEFAULT_TTL_SECONDS = MAX_TASK_WAIT_SECONDS + 900.0


class HoldsUnavailable(Exception):
    """A hold could not be taken (the database behind the holds failed): the call is refused, alone."""


def _zero() -> Amounts:
    return dict.fromkeys(AMOUNTS, 0)


class PoolHolds(Protocol):
    async def take(
        self, cluster: str, pool: str, amounts: Mapping[str, int], request_id: str = ""
    ) -> tuple[Amounts, Any]:
        """Hold `amounts` on the pool for a call; (what the holds before this one add, this hold's handle)."""
        ...

    async def give_back(self, handle: Any) -> None: ...
    async def give_back_call(self, request_id: str) -> None:
        """Give back the hold of a call reconciliation settled (whichever process took it)."""
        ...

    async def renew_call(self, request_id: str) -> None:
        """A call's task still runs (reconciliation found it so): its hold lapses a full TTL from now."""
        ...

    async def close(self) -> None: ...


class MemoryHolds:
    """This process's holds (the SQLite backend). take() has no await: atomic on the event loop."""

    def __init__(self, ttl: float = DEFAULT_TTL_SECONDS) -> None:
        self.ttl = ttl
        self._ids = itertools.count(1)
        # handle -> ((cluster, pool), amounts, lapses at (monotonic), request id)
        self._held: dict[int, tuple[tuple[str, str], Amounts, float, str]] = {}

    async def take(
        self, cluster: str, pool: str, amounts: Mapping[str, int], request_id: str = ""
    ) -> tuple[Amounts, int]:
        now = time.monotonic()
        for handle in [h for h, (_, _, until, _) in self._held.items() if until <= now]:
            del self._held[handle]
        before = _zero()
        for key, held, _, _ in self._held.values():
            if key == (cluster, pool):
                for k in AMOUNTS:
                    before[k] += held[k]
        handle = next(self._ids)
        self._held[handle] = ((cluster, pool), {k: int(amounts.get(k, 0)) for k in AMOUNTS}, now + self.ttl, request_id)
        return before, handle

    async def give_back(self, handle: Any) -> None:
        self._held.pop(handle, None)

    async def give_back_call(self, request_id: str) -> None:
        for handle in [h for h, (_, _, _, rid) in self._held.items() if rid == request_id]:
            del self._held[handle]

    async def renew_call(self, request_id: str) -> None:
        until = time.monotonic() + self.ttl
        for handle, (key, held, _, rid) in list(self._held.items()):
            if rid == request_id:
                self._held[handle] = (key, held, until, rid)

    def held(self) -> int:
        """How many holds are live (operators and tests look)."""
        return len(self._held)

    async def close(self) -> None:
        self._held.clear()


POSTGRES_V1 = """
CREATE TABLE IF NOT EXISTS pool_holds (
    id          BIGSERIAL PRIMARY KEY,
    request_id  TEXT NOT NULL,
    cluster     TEXT NOT NULL,
    pool        TEXT NOT NULL,
    guests      BIGINT NOT NULL,
    cores       BIGINT NOT NULL,
    memory_mib  BIGINT NOT NULL,
    disk_gib    BIGINT NOT NULL,
    expires_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS pool_holds_by_pool ON pool_holds(cluster, pool);
CREATE INDEX IF NOT EXISTS pool_holds_by_call ON pool_holds(request_id)
"""
MIGRATIONS: dict[str, Sequence[str]] = {"postgresql": [POSTGRES_V1]}


class SqlHolds:
    """Holds shared through the database: a row per hold, counted by every replica.

    Taking one is one transaction under an advisory lock on the pool: drop the lapsed rows, sum
    the live ones, insert this one. The database's clock is the one every replica agrees on.
    """

    def __init__(self, database: Database, ttl: float = DEFAULT_TTL_SECONDS) -> None:
        self.database = database
        self.ttl = ttl

    async def open(self) -> None:
        await self.database.open()
        try:
            await check(self.database, "holds", MIGRATIONS)
        except BaseException:
            await self.database.close()
            raise

    async def close(self) -> None:
        await self.database.close()

    async def take(
        self, cluster: str, pool: str, amounts: Mapping[str, int], request_id: str = ""
    ) -> tuple[Amounts, int]:
        sums = ", ".join(f"COALESCE(SUM({k}), 0) AS {k}" for k in AMOUNTS)
        async with self.database.transaction() as tx:
            await tx.lock("pool-holds:" + json.dumps([cluster, pool]))  # names of any characters, unambiguous
            now = await tx.now()
            await tx.execute(
                "DELETE FROM pool_holds WHERE cluster = ? AND pool = ? AND expires_at <= ?", cluster, pool, now
            )
            rows = await tx.fetch(f"SELECT {sums} FROM pool_holds WHERE cluster = ? AND pool = ?", cluster, pool)  # noqa: S608
            ids = await tx.fetch(
                f"INSERT INTO pool_holds (request_id, cluster, pool, {', '.join(AMOUNTS)}, expires_at) "  # noqa: S608
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                request_id,
                cluster,
                pool,
                *(int(amounts.get(k, 0)) for k in AMOUNTS),
                now + self.ttl,
            )
        return {k: int(rows[0][k]) for k in AMOUNTS}, int(ids[0]["id"])

    async def give_back(self, handle: Any) -> None:
        async with self.database.transaction() as tx:
            await tx.execute("DELETE FROM pool_holds WHERE id = ?", int(handle))

    async def give_back_call(self, request_id: str) -> None:
        async with self.database.transaction() as tx:
            await tx.execute("DELETE FROM pool_holds WHERE request_id = ?", request_id)

    async def renew_call(self, request_id: str) -> None:
        async with self.database.transaction() as tx:
            now = await tx.now()
            await tx.execute("UPDATE pool_holds SET expires_at = ? WHERE request_id = ?", now + self.ttl, request_id)

    async def held(self) -> int:
        rows = await self.database.fetch("SELECT COUNT(*) AS n FROM pool_holds")
        return int(rows[0]["n"])


class CallHold:
    """One call's hold, if it takes one: taken while its resources are read, ended with the call."""

    def __init__(self, holds: PoolHolds, request_id: str = "") -> None:
        self.holds = holds
        self.request_id = request_id
        self.handle: Any = None

    async def take(self, cluster: str, pool: str, amounts: Mapping[str, int]) -> Amounts:
        if self.handle is not None:  # one hold per call: a second read would count the call twice
            raise RuntimeError("this call already holds resources")
        try:
            before, self.handle = await self.holds.take(cluster, pool, amounts, self.request_id)
        except Exception as exc:  # not the audit's failure: this call is refused, the others go on
            log.warning("a pool hold could not be taken: %s", exc)  # the operator's detail, not the client's
            raise HoldsUnavailable(
                f"its pool's holds cannot be taken now ({type(exc).__name__}); nothing was sent, retry"
            ) from exc
        return before

    async def end(self, *, keep: bool) -> None:
        """Give the hold back, or (`keep`: the call's outcome is left to reconciliation) keep it until
        reconciliation settles the call (Outcomes.on_settled) or it lapses.
        A failure to give it back only keeps the pool held until the hold expires: logged, not raised."""
        handle, self.handle = self.handle, None
        if handle is None or keep:
            return
        try:
            await asyncio.shield(self.holds.give_back(handle))
        except Exception as exc:  # the call is over; its hold lapses by itself
            log.warning("a pool hold could not be given back (%s); it lapses by itself", type(exc).__name__)


async def build_holds(config: Config) -> PoolHolds:
    """The holds storage.url selects: rows shared by the replicas on PostgreSQL, else this process's."""
    if config.storage.postgresql:
        holds = SqlHolds(database(config))
        await holds.open()
        return holds
    return MemoryHolds()
