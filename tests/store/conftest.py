"""The storage suite runs unchanged against both backends: a real SQLite file and a real PostgreSQL.

`make_database()` gives a new, separate `Database` on one store per test (for PostgreSQL: its
own asyncpg pool, as a gateway replica holds; for SQLite: its own connection to the same file,
as another process on the host would): two of them stand for two replicas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.store.db import Database, PostgresDatabase, SqliteDatabase
from gateway.store.pgsync import PgLocation
from gateway.store.schema import upgrade_all
from tests.pgserver import PostgresServer
from tests.store.auditstore import Store, new_pg_database


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_database(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[], Database]]:
    """A factory of unopened Database objects on one fresh store of the backend under test."""
    if backend == "sqlite":
        path = tmp_path / "store.db"
        yield lambda: SqliteDatabase(path)
        return
    server: PostgresServer = request.getfixturevalue("postgres")
    dsn = await server.create_database("t_")
    db = PostgresDatabase(dsn)
    await db.open()
    try:
        await upgrade_all(db)  # what `pvegate db upgrade` does once; the stores only check it
    finally:
        await db.close()
    yield lambda: PostgresDatabase(dsn, max_size=20)


@pytest.fixture
async def open_database(make_database: Callable[[], Database]) -> AsyncIterator[Callable[[], Awaitable[Database]]]:
    """Open Database objects on the store (closed at the end of the test)."""
    opened: list[Database] = []

    async def one() -> Database:
        db = make_database()
        await db.open()
        opened.append(db)
        return db

    yield one
    for db in opened:
        await db.close()


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An audit store on each backend: a SQLite file, or a PostgreSQL database and the key every replica is given."""
    key = tmp_path / "keys" / "audit-head.key"
    if request.param == "sqlite":
        return Store("sqlite", tmp_path / "state" / "audit.db", key, tmp_path)
    server: PostgresServer = request.getfixturevalue("postgres")
    url = await new_pg_database(server, key=key)  # on PostgreSQL `pvegate db upgrade` makes it; a replica never does
    return Store("postgresql", PgLocation(url), key, tmp_path)
