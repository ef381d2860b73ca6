"""PostgreSQL failing in ways other than going away: a replica paused while it holds the chain's head,
the database refusing work (read-only, out of disk, a statement or lock timeout, an aborted transaction),
a row added past the audit's authenticated head, and a connection that dies just after its COMMIT.

Each is a clear refusal of the store (the gateway answers 503 with the reason, readiness learns of it),
bounded in seconds, and never a record lost, duplicated or reported failed when it was committed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.core.config import load
from gateway.store import audit as auditlib
from gateway.store import db as dblib
from gateway.store.audit import AuditIntegrityError, AuditLog, AuditStoreError
from gateway.store.db import DatabaseUnavailable, PostgresDatabase, database
from gateway.store.outcomes import AuditUnavailable, Outcomes
from gateway.store.pgsync import PgLocation
from gateway.store.usage import SqlQuotas
from tests.config.conftest import minimal, write
from tests.pgserver import PostgresServer
from tests.store.auditstore import Store, new_pg_database, off
from tests.store.test_audit_backends import rec, two_replicas


async def test_a_replicas_sessions_end_idle_transactions_and_wait_for_the_head_boundedly(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The settings that keep one stalled replica from stalling the others, on every session of its pools."""
    url, _key, (a, b) = await two_replicas(postgres, tmp_path)
    raw = minimal(tmp_path)
    raw["storage"] = {"url": url}
    stores = database(load(write(tmp_path, raw)))  # what the approvals and quota stores of a replica use
    await stores.open()
    try:
        for pool, lock in ((a._pgdb.pool, "5s"), (stores.pool, "5s")):  # type: ignore[attr-defined]
            async with pool.acquire() as conn:
                assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "10s"
                assert await conn.fetchval("SHOW lock_timeout") == lock
                assert await conn.fetchval("SHOW tcp_keepalives_idle") == "10"  # over TCP (127.0.0.1)
                assert await conn.fetchval("SHOW tcp_keepalives_interval") == "5"
                assert await conn.fetchval("SHOW tcp_keepalives_count") == "3"
    finally:
        await stores.close()
        await a.close()
        await b.close()
    assert dblib.IDLE_IN_TRANSACTION_SECONDS < auditlib.LEASE_SECONDS  # a stalled holder ends before a lease


async def test_a_replica_paused_holding_the_head_costs_the_others_seconds_not_their_audit_or_leases(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A stalls (a paused VM) right after it locked the chain's head row. B's append is refused
    within HEAD_LOCK_SECONDS with the reason, B's heartbeat goes on meanwhile, PostgreSQL ends A's
    transaction once it has been idle IDLE_IN_TRANSACTION_SECONDS and B appends again; A, resumed,
    fails its own append cleanly, then continues the chain. Nothing is lost or written twice."""
    monkeypatch.setattr(auditlib, "HEARTBEAT_SECONDS", 0.5)
    url, key, (a, b) = await two_replicas(postgres, tmp_path)
    locked, wake = asyncio.Event(), asyncio.Event()

    class Stalled:
        """A's connection, its process stopped as soon as the head row is locked."""

        def __init__(self, conn: Any) -> None:
            self.conn = conn

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

        async def _stall(self, sql: str) -> None:
            if "FOR UPDATE" in sql:
                locked.set()
                await wake.wait()

        # the head row is locked by one statement that also reads the record last seen (fetchrow)
        async def fetchval(self, sql: str, *args: Any, **kw: Any) -> Any:
            got = await self.conn.fetchval(sql, *args, **kw)
            await self._stall(sql)
            return got

        async def fetchrow(self, sql: str, *args: Any, **kw: Any) -> Any:
            got = await self.conn.fetchrow(sql, *args, **kw)
            await self._stall(sql)
            return got

    async def stalled_commit(conn: Any, records: list[Any]) -> Any:
        return await AuditLog._commit_on(a, Stalled(conn), records)

    monkeypatch.setattr(a, "_commit_on", stalled_commit)
    con = await asyncpg.connect(url)
    try:
        paused = asyncio.create_task(a.append(rec(1)))
        async with asyncio.timeout(5):
            await locked.wait()
        start = time.monotonic()
        refused = asyncio.create_task(b.append(rec(2)))
        seen = "SELECT seen_at FROM audit_replicas WHERE replica = $1"
        await asyncio.sleep(1.0)
        before = await con.fetchval(seen, b.replica_id)
        await asyncio.sleep(2.0)
        assert not refused.done()  # B's writer still waits for the head row ...
        assert await con.fetchval(seen, b.replica_id) > before  # ... and its heartbeat is renewed all the same
        with pytest.raises(AuditStoreError, match="another replica holds the audit head"):
            async with asyncio.timeout(auditlib.HEAD_LOCK_SECONDS + 3):
                await refused
        assert time.monotonic() - start < auditlib.HEAD_LOCK_SECONDS + 3
        assert b.last_error is not None and "another replica holds the audit head" in b.last_error

        # the server ends the stalled transaction: the head is free again
        idle = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state LIKE 'idle in transaction%'"
        )
        deadline = time.monotonic() + dblib.IDLE_IN_TRANSACTION_SECONDS + 5
        while await con.fetchval(idle) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert await con.fetchval(idle) == 0
        async with asyncio.timeout(5):
            await b.append(rec(3))
        assert b.last_error is None

        wake.set()  # A resumes: its transaction is gone, so is its append
        with pytest.raises(AuditStoreError, match="PostgreSQL"):
            async with asyncio.timeout(10):
                await paused
        monkeypatch.undo()
        await a.append(rec(4))  # and it continues the chain from B's head
    finally:
        wake.set()
        await con.close()
        await a.close()
        await b.close()
    checked = off(auditlib.verify, PgLocation(url), key=key)
    assert checked.ok, checked.problem
    rows = off(auditlib.search, PgLocation(url), auditlib.Query(limit=100))
    assert sorted(r["request_id"] for r in rows) == ["req-3", "req-4"]


async def test_a_record_added_past_the_head_is_an_integrity_failure_not_the_callers(store: Store) -> None:
    """Another hand inserts a row numbered past the authenticated head: every append clashes on its
    seq. That is the store's integrity (readiness red, every caller refused with the reason), not a
    bad record of one caller (an internal error per call while readiness stays green)."""
    log = store.log()
    await log.open()
    try:
        await log.append(rec(1))
        store.sql(
            "INSERT INTO audit SELECT seq + 1, ts, request_id, kind, principal, tool, target, outcome, body, "
            "hash, hash FROM audit WHERE seq = (SELECT max(seq) FROM audit)"
        )
        with pytest.raises(AuditIntegrityError, match="record 2 exists past the authenticated head"):
            await log.append(rec(2))
        assert log.last_error is not None and "record 2 exists past" in log.last_error  # readiness: red
        outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
        with pytest.raises(AuditUnavailable, match="record 2 exists past the authenticated head"):
            await outcomes.append(rec(3))
        assert not outcomes.store_ok()
    finally:
        await log.close()


# (what the database is made to do, its settings for new sessions, the reason the refusal gives)
REFUSALS = {
    "read-only": (
        [],
        {"default_transaction_read_only": "on"},
        "PostgreSQL refuses writes: the database is read-only",
    ),
    "disk full": (
        [
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
            "'could not extend file: No space left on device' USING ERRCODE = '53100'; END $$"
        ],
        {},
        r"PostgreSQL is out of resources \(disk space",
    ),
    "statement timeout": (
        [
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN PERFORM pg_sleep(3); RETURN NEW; END $$"
        ],
        {"statement_timeout": "300ms"},
        "PostgreSQL cancelled a statement that ran past statement_timeout",
    ),
    "serialization failure": (
        [
            "CREATE FUNCTION fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION "
            "'could not serialize access' USING ERRCODE = '40001'; END $$"
        ],
        {},
        "PostgreSQL aborted the transaction",
    ),
}


@pytest.mark.parametrize("fault", sorted(REFUSALS))
async def test_a_database_that_refuses_the_work_is_a_store_refusal_with_its_reason(
    postgres: PostgresServer, fault: str
) -> None:
    """Not an internal error, and not "cannot be reached" when it can: DatabaseUnavailable (the call is
    refused with a 503 like an unreachable store) saying what PostgreSQL refused."""
    url = await new_pg_database(postgres, "f_")
    setup, settings, reason = REFUSALS[fault]
    con = await asyncpg.connect(url)
    try:
        for stmt in setup:
            await con.execute(stmt)
        if setup:
            await con.execute(
                "CREATE TRIGGER fault BEFORE INSERT ON usage_events FOR EACH ROW EXECUTE FUNCTION fault()"
            )
        for name, value in settings.items():  # what an operator (or a failover to a standby) does
            await con.execute(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET {name} = '{value}'")
    finally:
        await con.close()
    quotas = SqlQuotas(PostgresDatabase(url))
    await quotas.open()
    try:
        with pytest.raises(DatabaseUnavailable, match=reason) as got:
            async with asyncio.timeout(10):
                await quotas.reserve("p", "vm_start")
        assert "cannot be reached" not in str(got.value)
    finally:
        await quotas.close()


async def test_a_lock_held_elsewhere_past_lock_timeout_and_a_slow_read_are_refusals(postgres: PostgresServer) -> None:
    url = await new_pg_database(postgres, "f_")
    con = await asyncpg.connect(url)
    try:
        for name, value in (("lock_timeout", "300ms"), ("statement_timeout", "1s")):
            await con.execute(f"ALTER DATABASE \"{url.rsplit('/', 1)[1]}\" SET {name} = '{value}'")
    finally:
        await con.close()
    db = PostgresDatabase(url)
    quotas = SqlQuotas(db)
    await quotas.open()
    holder = await asyncpg.connect(url)
    try:
        async with holder.transaction():  # another replica in the middle of a reservation for the same principal
            await holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('usage:p', 0))")
            with pytest.raises(DatabaseUnavailable, match="a lock stayed held past lock_timeout"):
                await quotas.reserve("p", "vm_start")
        counts, _slot = await quotas.reserve("p", "vm_start")  # released: served again
        assert counts["tool"]["1m"] == 0
        with pytest.raises(DatabaseUnavailable, match="ran past statement_timeout"):
            await db.fetch("SELECT pg_sleep(3)")
    finally:
        await holder.close()
        await quotas.close()


async def test_what_the_caller_sent_wrong_stays_the_callers(postgres: PostgresServer) -> None:
    """A value PostgreSQL cannot take is no store refusal: it is raised as it is (that call fails alone)."""
    url = await new_pg_database(postgres, "f_")
    db = PostgresDatabase(url)
    await db.open()
    try:
        with pytest.raises(asyncpg.DataError):
            async with db.transaction() as tx:
                await tx.fetch("SELECT 'not a number'::int")
    finally:
        await db.close()


@pytest.fixture
def dies_after_commit(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Once armed (append to the list), the next release of a pooled connection finds it dead, as when
    the connection is cut right after COMMIT: asyncpg terminates it and raises."""
    armed: list[int] = []
    release = asyncpg.pool.Pool.release

    async def dying(self: Any, connection: Any, *, timeout: float | None = None) -> None:
        if not armed:
            return await release(self, connection, timeout=timeout)
        armed.pop()
        connection.terminate()
        raise asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation")

    monkeypatch.setattr(asyncpg.pool.Pool, "release", dying)
    return armed


async def test_an_audit_commit_is_not_reported_failed_when_its_connection_dies_after_commit(
    postgres: PostgresServer, tmp_path: Path, dies_after_commit: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records are in the chain: the caller is told so (and its call goes on), never refused."""
    monkeypatch.setattr(auditlib, "HEARTBEAT_SECONDS", 3600.0)  # no heartbeat on a connection of its own meanwhile
    url, key, (a, b) = await two_replicas(postgres, tmp_path)
    try:
        dies_after_commit.append(1)
        await a.append(rec(1))  # committed: not an error
        assert not dies_after_commit and a.last_error is None
        await a.append(rec(2))  # the pool made a new connection
        await b.append(rec(3))
    finally:
        await a.close()
        await b.close()
    checked = off(auditlib.verify, PgLocation(url), key=key)
    assert checked.ok and checked.checked == 3, checked.problem


async def test_a_store_transaction_is_not_reported_failed_when_its_connection_dies_after_commit(
    postgres: PostgresServer, dies_after_commit: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A quota slot taken (or an approval consumed) while the caller is told it failed would be refused
    and still count: once COMMIT succeeded the transaction succeeded, and the dead connection is logged."""
    url = await new_pg_database(postgres, "f_")
    quotas = SqlQuotas(PostgresDatabase(url))
    await quotas.open()
    try:
        dies_after_commit.append(1)
        _counts, slot = await quotas.reserve("p", "vm_start")
        assert not dies_after_commit
        assert "failed after its transaction committed" in caplog.text
        counts, _ = await quotas.reserve("p", "vm_start")
        assert counts["tool"]["1m"] == 1  # the first reservation stands
        await quotas.release("p", "vm_start", slot)
    finally:
        await quotas.close()
