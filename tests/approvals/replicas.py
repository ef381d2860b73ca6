"""Two approvals replicas on one database, for the catch-up tests: A, live, and B, a replica starting up (or
A restarted) whose first sweep catches up. On SQLite the two share the host's one audit writer (its lock);
on PostgreSQL each has its own pool and audit writer. The stores are the test's own ApprovalStore subclass,
which holds a transition or a catch-up at the window the test races in."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import asyncpg
import pytest

from gateway.store.approvals import Approvals, ApprovalStore
from gateway.store.audit import AuditLog
from gateway.store.db import PostgresDatabase, SqliteDatabase
from gateway.store.pgsync import PgLocation
from tests.store.auditstore import new_pg_database
from tests.support import audit_rows

S = TypeVar("S", bound=ApprovalStore)


@dataclass
class Replicas(Generic[S]):
    a: Approvals
    b: Approvals
    stores: tuple[S, S]  # a's and b's
    rows: Callable[[], Awaitable[list[dict[str, Any]]]]  # every `approval` record: request_id, outcome, body

    @property
    def store_a(self) -> S:
        return self.stores[0]

    @property
    def store_b(self) -> S:
        return self.stores[1]

    async def under(self, request_id: str, outcome: str) -> list[dict[str, Any]]:
        """The `approval` records with `outcome` filed under `request_id` (an approval's or a call's id)."""
        return [r for r in await self.rows() if r["request_id"] == request_id and r["outcome"] == outcome]

    async def records(self, request_id: str, outcome: str) -> list[dict[str, Any]]:
        """Their bodies."""
        return [r["body"] for r in await self.under(request_id, outcome)]


def parsed(rows: list[Any]) -> list[dict[str, Any]]:
    return [{"request_id": r["request_id"], "outcome": r["outcome"], "body": json.loads(str(r["body"]))} for r in rows]


@asynccontextmanager
async def _on_sqlite(tmp_path: Path, store_type: type[S]) -> AsyncIterator[Replicas[S]]:
    path = tmp_path / "audit.db"
    audit = AuditLog(path)  # one SQLite audit per host (its writer lock): the replicas share it
    await audit.open()
    stores = (store_type(SqliteDatabase(path)), store_type(SqliteDatabase(path)))
    for s in stores:
        await s.open()

    async def rows() -> list[dict[str, Any]]:
        return parsed([r for r in audit_rows(path) if r["kind"] == "approval"])

    try:
        yield Replicas(Approvals(stores[0], audit), Approvals(stores[1], audit), stores, rows)
    finally:
        await audit.close()
        for s in stores:
            await s.close()


@asynccontextmanager
async def _on_postgres(postgres: Any, tmp_path: Path, store_type: type[S]) -> AsyncIterator[Replicas[S]]:
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    made: list[Approvals] = []
    stores: list[S] = []

    async def rows() -> list[dict[str, Any]]:
        con = await asyncpg.connect(url)
        try:
            found = await con.fetch("SELECT request_id, outcome, body FROM audit WHERE kind = 'approval' ORDER BY seq")
        finally:
            await con.close()
        return parsed(list(found))

    try:
        for _ in range(2):
            store = store_type(PostgresDatabase(url))
            await store.open()
            stores.append(store)
            audit = AuditLog(PgLocation(url), head_key=key)
            await audit.open()
            made.append(Approvals(store, audit))
        yield Replicas(made[0], made[1], (stores[0], stores[1]), rows)
    finally:
        for r in made:
            if r.audit is not None:
                await r.audit.close()
            await r.close()


@asynccontextmanager
async def replicas_on(
    request: pytest.FixtureRequest, tmp_path: Path, store_type: type[S]
) -> AsyncIterator[Replicas[S]]:
    """The pair on the fixture's param, "sqlite" or "postgres" (the session's real server), after A's start-up
    sweep: B's comes in each test."""
    if request.param == "postgres":
        pair = _on_postgres(request.getfixturevalue("postgres"), tmp_path, store_type)
    else:
        pair = _on_sqlite(tmp_path, store_type)
    async with pair as made:
        assert await made.a.expire_due() == []
        yield made


async def reopened(path: Path) -> AuditLog:
    """A new audit writer on the SQLite file at `path` (as after a restart, or once the store takes writes)."""
    audit = AuditLog(path)
    await audit.open()
    return audit


async def catch_up_when_writes_resume(approvals: Approvals, path: Path) -> None:
    """After a record failed (the audit closed under `approvals`): the audit takes writes again, this process
    sweeps twice (the record is written once), then a later process's first sweep, on a new writer, on the
    same store: still once. Closes the writers it opens."""
    approvals.audit = await reopened(path)
    await approvals.expire_due()
    await approvals.expire_due()
    await approvals.audit.close()
    restarted = Approvals(approvals.store, await reopened(path))
    await restarted.expire_due()
    assert restarted.audit is not None
    await restarted.audit.close()
