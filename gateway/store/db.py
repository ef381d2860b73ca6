"""One small SQL interface over the two storage backends: SQLite (aiosqlite) and PostgreSQL (asyncpg).

The stores (approvals, quota usage) write their SQL once, with `?` placeholders and portable
types; the backend translates placeholders, maps a unique-key violation to `Conflict`, and
provides the two things that differ in how concurrent writers are kept apart:

- SQLite: one writer at a time (`BEGIN IMMEDIATE`), so a transaction sees no concurrent write;
  `lock()` and `for_update` are not needed.
- PostgreSQL (READ COMMITTED, several replicas): `lock(key)` takes a transaction-scoped advisory
  lock, and `for_update` makes a read of a row wait for, and then see, a concurrent writer of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import aiosqlite

from gateway.core.config import Config, SecretRef


class Conflict(Exception):
    """A unique key (or primary key) is already taken."""


class DatabaseUnavailable(Exception):
    """PostgreSQL cannot be reached (down, restarting, the connection cut): the statement did not
    run, or its transaction was rolled back. Callers refuse the call; the next one tries again
    (the pool replaces broken connections), so a restarted server is used without a gateway restart."""


def _connection_errors() -> tuple[type[BaseException], ...]:
    import asyncpg

    return (
        OSError,  # refused, reset, unreachable
        TimeoutError,
        asyncpg.PostgresConnectionError,  # the connection is gone or was never made
        asyncpg.InterfaceError,  # "connection is closed" on a connection the server dropped
        asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up, crash recovery
        asyncpg.exceptions.TooManyConnectionsError,
    )


class Tx(Protocol):
    for_update: str  # appended to a SELECT of rows the transaction will change

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]: ...
    async def execute(self, sql: str, *args: Any) -> int:
        """Run a statement; the number of rows it changed."""
        ...

    async def lock(self, key: str) -> None:
        """Hold `key` until the transaction ends (writers of the same key queue up)."""
        ...

    async def now(self) -> float:
        """The database's clock (epoch seconds): one clock for every replica."""
        ...


class Database(Protocol):
    kind: str  # "sqlite" | "postgresql"

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def transaction(self) -> contextlib.AbstractAsyncContextManager[Tx]: ...
    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        """A read outside any transaction, fully fetched."""
        ...


class _SqliteTx:
    for_update = ""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        async with self._db.execute(sql, args) as cur:
            return [dict(r) for r in await cur.fetchall()]

    async def execute(self, sql: str, *args: Any) -> int:
        try:
            cur = await self._db.execute(sql, args)
        except aiosqlite.IntegrityError as exc:
            if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
                raise Conflict(str(exc)) from exc
            raise
        changed = cur.rowcount
        await cur.close()
        return int(changed)

    async def lock(self, key: str) -> None:
        return None  # BEGIN IMMEDIATE already excludes every other writer of the file

    async def now(self) -> float:
        return time.time()


WAL_WAIT_S = 10.0  # as long as busy_timeout


def _locked(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def wal_mode(con: sqlite3.Connection) -> None:
    """PRAGMA journal_mode=WAL, waiting out another process's first open of the same file.

    Switching a new file to WAL needs its exclusive lock, and SQLite answers "database is
    locked" at once (no busy handler) while a second process does the same: two replicas or a
    gateway and `pvegate db upgrade` started together would otherwise fail at random."""
    deadline = time.monotonic() + WAL_WAIT_S
    while True:
        try:
            con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _locked(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.02)


async def wal_mode_async(db: aiosqlite.Connection) -> None:
    """wal_mode on an aiosqlite connection (the same wait, without blocking the event loop)."""
    deadline = time.monotonic() + WAL_WAIT_S
    while True:
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _locked(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.02)


class SqliteDatabase:
    """One connection to the database file; transactions are serialised on it (and across
    processes on the file by SQLite's write lock, waited for up to busy_timeout)."""

    kind = "sqlite"

    def __init__(self, path: Path, synchronous: str = "FULL", read_only: bool = False) -> None:
        self.path = path
        self.synchronous = synchronous
        self.read_only = read_only  # `pvegate db status`: never creates the file nor writes to it
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()  # one multi-statement transaction at a time on this connection

    async def open(self) -> None:
        if self.read_only:
            self._db = await aiosqlite.connect(
                f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
            )
            self._db.row_factory = aiosqlite.Row
            await self._db.execute("PRAGMA busy_timeout=10000")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path, isolation_level=None)
        self._db.row_factory = aiosqlite.Row
        try:  # closed again on any failure: aiosqlite's thread, left open, keeps the process from exiting
            await self._db.execute("PRAGMA busy_timeout=10000")
            await wal_mode_async(self._db)
            await self._db.execute(f"PRAGMA synchronous={self.synchronous}")
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError(f"database {self.path} is not open")
        return self._db

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        async with self._lock:
            await self.db.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTx(self.db)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.db.execute("ROLLBACK")
                raise
            await self.db.execute("COMMIT")

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        # under the lock and fully fetched: an open read would pin an old snapshot and make
        # the next write on this connection fail as busy
        async with self._lock:
            return await _SqliteTx(self.db).fetch(sql, *args)


_PLACEHOLDER = re.compile(r"\?")


def pg_sql(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2, ...` (the stores' SQL has no literal `?`)."""
    n = 0

    def number(_: re.Match[str]) -> str:
        nonlocal n
        n += 1
        return f"${n}"

    return _PLACEHOLDER.sub(number, sql)


class _PostgresTx:
    for_update = " FOR UPDATE"

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._conn.fetch(pg_sql(sql), *args)]

    async def execute(self, sql: str, *args: Any) -> int:
        import asyncpg

        try:
            status = await self._conn.execute(pg_sql(sql), *args)
        except asyncpg.UniqueViolationError as exc:
            raise Conflict(str(exc)) from exc
        tail = str(status).rsplit(" ", 1)[-1]  # "UPDATE 1", "INSERT 0 1", "DELETE 3"
        return int(tail) if tail.isdigit() else 0

    async def lock(self, key: str) -> None:
        await self._conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)

    async def now(self) -> float:
        return float(await self._conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8"))


class PostgresDatabase:
    """An asyncpg pool; each transaction on a connection of its own."""

    kind = "postgresql"

    def __init__(
        self, dsn: str, password: SecretRef | None = None, max_size: int = 10, read_only: bool = False
    ) -> None:
        self.dsn = dsn
        self.password = password
        self.max_size = max_size
        self.read_only = read_only  # the server refuses any write on these connections
        self._pool: Any = None

    async def open(self) -> None:
        import asyncpg

        password = self.password.read() if self.password is not None else None
        settings = {"default_transaction_read_only": "on"} if self.read_only else {}
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn,
                password=password,
                min_size=1,
                max_size=self.max_size,
                command_timeout=30,
                timeout=10,  # connecting: an unreachable server is a refusal in seconds, not a minute
                server_settings=settings,
            )
        except _connection_errors() as exc:
            raise DatabaseUnavailable(f"PostgreSQL cannot be reached: {_why(exc)}") from exc

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> Any:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL pool is not open")
        return self._pool

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                yield _PostgresTx(conn)
        except _connection_errors() as exc:
            raise DatabaseUnavailable(f"PostgreSQL cannot be reached: {_why(exc)}") from exc

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        try:
            async with self.pool.acquire() as conn:
                return await _PostgresTx(conn).fetch(sql, *args)
        except _connection_errors() as exc:
            raise DatabaseUnavailable(f"PostgreSQL cannot be reached: {_why(exc)}") from exc


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def database(config: Config, sqlite_path: Path | None = None, read_only: bool = False) -> Database:
    """The backend storage.url selects (not yet open); SQLite in the audit database file by default."""
    if config.storage.postgresql:
        assert config.storage.url is not None
        return PostgresDatabase(
            config.storage.url, config.storage.password, config.storage.pool_max_size, read_only=read_only
        )
    return SqliteDatabase(sqlite_path or config.audit_path, read_only=read_only)
