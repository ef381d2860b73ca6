"""The shared quota counters (store/usage.py, table `usage_events`) keep only the last 24 hours.

A reservation pruned the rows of its own principal only: a principal that stops calling (an agent's run
with a sub of its own, a retired service account, a principal renamed at the identity provider) left
its rows in the table for ever, so with principals that come and go the table every replica counts in
grew without bound. Rows older than every window (24 h, by the database's clock) are swept whoever made
them, by a bounded statement that never waits for a row another replica's reservation holds.
"""

from __future__ import annotations

import asyncpg

from gateway.store.db import PostgresDatabase
from gateway.store.usage import WINDOWS, SqlQuotas
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database


async def test_rows_of_principals_that_stopped_calling_are_swept_after_a_day(postgres: PostgresServer) -> None:
    url = await new_pg_database(postgres, "u_")
    a, b = SqlQuotas(PostgresDatabase(url)), SqlQuotas(PostgresDatabase(url))
    await a.open()
    await b.open()
    dba = await asyncpg.connect(url)
    try:
        for sub in ("run-1", "run-2", "run-3"):  # principals of yesterday, gone since
            await a.reserve(sub, "vm_start")
        # their calls were more than a day ago on the database's clock
        await dba.execute("UPDATE usage_events SET at = at - $1", WINDOWS["24h"] + 60)
        counts, _ = await b.reserve("run-4", "vm_start")  # today's principal, on another replica
        assert counts["all"]["24h"] == 0
        left = await dba.fetch("SELECT principal FROM usage_events ORDER BY id")
        assert [r["principal"] for r in left] == ["run-4"], left
        # a live row of another principal is never swept
        counts, _ = await a.reserve("run-5", "vm_start")
        counts, _ = await a.reserve("run-4", "vm_start")
        assert counts["all"]["24h"] == 1
        assert await dba.fetchval("SELECT count(*) FROM usage_events") == 3
    finally:
        await dba.close()
        await a.close()
        await b.close()
