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
import contextvars
import logging
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiosqlite

from gateway.core.config import Config, SecretRef

log = logging.getLogger("pvegate.db")


class Conflict(Exception):
    """A unique key (or primary key) is already taken."""


class DatabaseUnavailable(Exception):
    """PostgreSQL cannot be reached (down, restarting, the connection cut) or refuses the work as a
    whole (read-only, out of disk or memory, a statement or lock timeout, a transaction it aborted):
    the statement did not run, or its transaction was rolled back. The message says which. Callers
    refuse the call as for an unavailable store; the next one tries again (the pool replaces broken
    connections), so a restarted server is used without a gateway restart."""


def _connection_errors() -> tuple[type[BaseException], ...]:
    import asyncpg

    return (
        OSError,  # refused, reset, unreachable
        TimeoutError,
        asyncpg.PostgresConnectionError,  # the connection is gone or was never made
        asyncpg.InterfaceError,  # "connection is closed" on a connection the server dropped
        # the driver's protocol left in a state it cannot go on from: the server's FATAL message (a fast
        # shutdown, a terminated backend) read on a pooled connection before its close, then a statement
        # ("cannot switch to state 15; another operation (2) is in progress")
        asyncpg.exceptions.InternalClientError,
        asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up, crash recovery
        asyncpg.exceptions.TooManyConnectionsError,
    )


def _in_doubt(exc: BaseException) -> bool:
    """The connection an error came from cannot be trusted again (cut, ended by the server, its protocol
    state broken): it is terminated, never handed back to the pool (which would try to reset it, or give
    it to the next caller). A statement's own failure, or a timeout asyncpg cancels cleanly, is not."""
    import asyncpg

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, asyncpg.exceptions.QueryCanceledError | TimeoutError):
            return False
        if isinstance(
            cur,
            asyncpg.exceptions.InternalClientError
            | asyncpg.InterfaceError
            | asyncpg.PostgresConnectionError
            | asyncpg.exceptions.OperatorInterventionError
            | OSError,
        ):
            return True
        cur = cur.__cause__ if isinstance(cur, DatabaseUnavailable) else None
    return False


async def _give_back(pool: Any, conn: Any, exc: BaseException) -> None:
    """Return a connection after a failed transaction or read, terminated first when it is in doubt.
    Never raises: the error that ended the work is the one to tell."""
    with contextlib.suppress(Exception):
        if _in_doubt(exc):
            conn.terminate()
        await pool.release(conn)


# A replica's sessions (the gateway's stores and audit): PostgreSQL ends a transaction left idle this long
# (its replica paused or frozen mid-transaction, or cut off), which releases the row and advisory locks it
# held, so one stalled replica holds the others up for seconds, not for as long as its process stays
# stopped. Well under the audit's lease (audit.LEASE_SECONDS): no heartbeat waits that long.
IDLE_IN_TRANSACTION_SECONDS = 10
# TCP keepalives from the server on every session: a client that vanished (a frozen VM, a cut network)
# is found within idle + interval * count = 25 s and its backend ended (ignored on Unix-domain sockets)
KEEPALIVES = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"}
# A lock held elsewhere (another replica's transaction, an operator's `LOCK TABLE`, a `pvegate db upgrade`'s DDL
# while replicas serve) refuses a replica's statement after this many seconds ("a lock stayed held past
# lock_timeout"), instead of holding the call, and its pool connection, for the whole command timeout
LOCK_TIMEOUT_SECONDS = 5
REPLICA_SETTINGS = {
    "idle_in_transaction_session_timeout": f"{IDLE_IN_TRANSACTION_SECONDS}s",
    "lock_timeout": f"{LOCK_TIMEOUT_SECONDS}s",
}
# Seconds a store's transaction (or read) waits for a connection of its pool: when every connection is busy
# (statements waiting for a lock, a slow server) a call is refused after this, never queued for minutes;
# as long as the audit's wait (audit.ACQUIRE_TIMEOUT)
ACQUIRE_TIMEOUT_SECONDS = 10.0
# Every PostgreSQL session names objects through its role's or database's own search_path with pg_catalog
# moved first (the schemas found once on connecting; the first of them is where pvegate's tables are): an
# operator or function someone adds to one of them (`public.=` for text) and puts before the catalog with
# `ALTER ROLE/DATABASE ... SET search_path` must not change what `principal = $1` matches. Tables are still
# made in pvegate's schema: an upgrade's DDL puts it first for its own statements (migrations._creating).
SCHEMA_PROBE = "SELECT current_schemas(false)"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pinned_search_path(schemas: Sequence[str] | None) -> str | None:
    """The search_path of pvegate's sessions from the schemas of the session's own (None: none exists, left)."""
    rest = [quote_ident(str(n)) for n in schemas or () if n != "pg_catalog"]
    return None if not rest else ", ".join(["pg_catalog", *rest, "pg_temp"])


async def probe_search_path(dsn: str, password: str | None, connect_timeout: float) -> str | None:
    """The pinned search_path for the schema a new session of `dsn` would make its tables in."""
    import asyncpg

    conn = await asyncpg.connect(dsn, password=password, timeout=connect_timeout)
    try:
        return pinned_search_path(await conn.fetchval(SCHEMA_PROBE))
    finally:
        await conn.close()


# Seconds the gateway waits for the answer to one statement (asyncpg's command_timeout): a server that stopped
# answering mid-statement (overloaded, frozen, the network cut without a reset) is a refusal after this
COMMAND_TIMEOUT_SECONDS = 30.0


def _sqlstate(exc: BaseException) -> str:
    import asyncpg

    return str(getattr(exc, "sqlstate", "") or "") if isinstance(exc, asyncpg.PostgresError) else ""


def refusal(exc: BaseException) -> str | None:
    """Why PostgreSQL did not do the work, when the error is the store's (unreachable, the login or the database
    refused, invalid connection settings, read-only, out of resources, a timeout, a lock held elsewhere, a
    transaction it aborted), as a sentence; None when the error is about what was sent (a bad value, a key
    taken, a bug in a statement): the caller's own."""
    import asyncpg

    cause = exc.__context__
    if isinstance(exc, asyncpg.InterfaceError) and cause is not None and cause is not exc:
        # "the underlying connection is closed" while rolling back: the error that closed it says why
        inner = refusal(cause)
        if inner is not None:
            return inner
    state, why = _sqlstate(exc), _why(exc)
    if state == "57014":  # a subclass of OperatorInterventionError, but the server is well
        return f"PostgreSQL cancelled a statement that ran past statement_timeout (or an operator cancelled it): {why}"
    if state == "25P03":
        return (
            "PostgreSQL ended the session: its transaction stayed idle past idle_in_transaction_session_timeout "
            f"(this process was paused or cut off mid-transaction), and was rolled back: {why}"
        )
    if state in ("28P01", "28000"):
        return (
            "PostgreSQL refuses the login: the user or password is wrong (storage.url, storage.password), or "
            f"pg_hba.conf does not admit this client: {why}"
        )
    if state == "3D000":
        return f"the database storage.url names does not exist on the PostgreSQL server (create it first): {why}"
    if isinstance(exc, asyncpg.ClientConfigurationError):  # e.g. an unknown sslmode: nothing was sent
        return f"the PostgreSQL connection settings are invalid (storage.url): {why}"
    if isinstance(exc, TimeoutError):
        return "PostgreSQL cannot be reached: it did not answer in time (down, unreachable or overloaded)"
    if isinstance(exc, _connection_errors()):
        return f"PostgreSQL cannot be reached: {why}"
    if state == "25006":
        return f"PostgreSQL refuses writes: the database is read-only (a standby, default_transaction_read_only): {why}"
    if state.startswith("53"):
        return f"PostgreSQL is out of resources (disk space, memory or connections): {why}"
    if state == "55P03":
        return (
            "a lock stayed held past lock_timeout (held by another replica that is paused, slow or cut off, by an "
            f"operator's session, or by a schema upgrade): {why}"
        )
    if state.startswith("40"):
        return f"PostgreSQL aborted the transaction (a serialization failure or a deadlock); a retry may succeed: {why}"
    if state.startswith(("58", "XX")):
        return f"PostgreSQL failed (an I/O error, or corrupted data): {why}"
    if state == "42501":
        return f"PostgreSQL denies the gateway's role what it needs (permission denied): {why}"
    return None


def invalid_value(exc: BaseException) -> str | None:
    """Why PostgreSQL refused a value the caller sent (SQLSTATE class 22, "data exception": a NUL character in a
    text, an invalid number or date, a value out of range), as a sentence for that caller; None for any other
    error. Not the store's failure: the statement did not run, this request is refused, the others go on."""
    state = _sqlstate(exc)
    if not state.startswith("22"):
        return None
    return f"the database refuses a value of this request: {_why(exc)}"


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """Raise the store's errors (see `refusal`) as DatabaseUnavailable; the caller's own pass unchanged."""
    try:
        yield
    except Exception as exc:
        why = None if isinstance(exc, DatabaseUnavailable) else refusal(exc)
        if why is None:
            raise
        raise DatabaseUnavailable(why) from exc


async def release_committed(pool: Any, conn: Any) -> None:
    """Give a connection back to the pool after its transaction committed. The commit stands, so an error
    here (the connection died just after COMMIT) is logged, never raised: a caller told its work failed
    would refuse a call whose approval was consumed or whose quota slot was taken. The pool ends such a
    connection and makes a new one."""
    try:
        await pool.release(conn)
    except Exception as exc:
        log.warning("a PostgreSQL connection failed after its transaction committed (it is dropped): %s", _why(exc))
        with contextlib.suppress(Exception):
            conn.terminate()


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

    async def now(self) -> float:
        """The database's clock (epoch seconds) outside any transaction, as `Tx.now` reads it inside one."""
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


def create_private(path: Path) -> None:
    """Create a database file only its owner may read (0600) when there is none yet: SQLite gives
    its -wal and -shm files the database file's mode, so what the stores keep (principals, the
    arguments of calls, decisions, approval requests) is never world-readable, whatever the umask.
    An existing file keeps the mode its operator gave it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o004:  # made by an older release, or by hand: said, not changed
                log.warning("%s is readable by every user of this host: chmod 600 it (and its -wal, -shm)", path)
        return
    os.close(fd)


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
        await asyncio.to_thread(create_private, self.path)
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

    async def now(self) -> float:
        return time.time()  # one host's file: the same clock, no round trip


_PLACEHOLDER = re.compile(r"\?")


def pg_sql(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2, ...` (the stores' SQL has no literal `?`)."""
    n = 0

    def number(_: re.Match[str]) -> str:
        nonlocal n
        n += 1
        return f"${n}"

    return _PLACEHOLDER.sub(number, sql)


# the server's clock as it runs, not the transaction's start (now()): a long transaction still reads the time
_PG_NOW = "SELECT extract(epoch FROM clock_timestamp())::float8 AS now"


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
        return float(await self._conn.fetchval(_PG_NOW))


class PostgresDatabase:
    """An asyncpg pool; each transaction on a connection of its own.

    Bounded waits: a connection of the pool within `acquire_timeout` (else DatabaseUnavailable: all are busy,
    or the server gives none), each statement's answer within `command_timeout`, and (REPLICA_SETTINGS) a lock
    within lock_timeout: a lock held elsewhere refuses a call in seconds, it does not queue every call."""

    kind = "postgresql"

    def __init__(
        self,
        dsn: str,
        password: SecretRef | None = None,
        max_size: int = 10,
        read_only: bool = False,
        settings: Mapping[str, str] | None = None,
        *,
        acquire_timeout: float = ACQUIRE_TIMEOUT_SECONDS,
        command_timeout: float = COMMAND_TIMEOUT_SECONDS,
    ) -> None:
        self.dsn = dsn
        self.password = password
        self.max_size = max_size
        self.read_only = read_only  # the server refuses any write on these connections
        # server settings of every session, on top of KEEPALIVES (a replica's: REPLICA_SETTINGS)
        self.settings = dict(settings or {})
        self.acquire_timeout = acquire_timeout
        self.command_timeout = command_timeout
        self._pool: Any = None

    async def open(self) -> None:
        import asyncpg

        password = self.password.read() if self.password is not None else None
        settings = {**KEEPALIVES, **self.settings}
        if self.read_only:
            settings["default_transaction_read_only"] = "on"
        with refusals():
            pinned = await probe_search_path(self.dsn, password, 10)
            if pinned is not None:  # a startup setting: kept through the pool's RESET ALL between transactions
                settings["search_path"] = pinned
            self._pool = await asyncpg.create_pool(
                self.dsn,
                password=password,
                min_size=1,
                max_size=self.max_size,
                command_timeout=self.command_timeout,
                timeout=10,  # connecting: an unreachable server is a refusal in seconds, not a minute
                server_settings=settings,
            )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> Any:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL pool is not open")
        return self._pool

    async def _acquire(self) -> Any:
        """A connection of the pool, waited for at most acquire_timeout (DatabaseUnavailable after it)."""
        pool = self.pool
        try:
            with refusals():
                return await pool.acquire(timeout=self.acquire_timeout)
        except DatabaseUnavailable as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise
            # a timeout: which wait it was (busy connections, or none to be had) is known here
            if pool.get_size() >= self.max_size and pool.get_idle_size() == 0:
                why = (
                    f"all {self.max_size} connections of this process's pool (storage.pool_max_size) stayed busy "
                    f"for {self.acquire_timeout:g} s: PostgreSQL did not answer in time (statements waiting for "
                    "a lock held elsewhere, or a slow server)"
                )
            else:
                why = f"PostgreSQL cannot be reached: no new connection within {self.acquire_timeout:g} s"
            raise DatabaseUnavailable(why) from exc.__cause__

    def _slow(self) -> DatabaseUnavailable:
        return DatabaseUnavailable(
            f"PostgreSQL did not answer a statement within {self.command_timeout:g} s (it waits for a lock held "
            "elsewhere, the server is overloaded, or the connection was cut without notice); it was cancelled"
        )

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        pool = self.pool
        conn = await self._acquire()
        try:
            try:
                with refusals():
                    async with conn.transaction():
                        yield _PostgresTx(conn)
            except DatabaseUnavailable as exc:
                if isinstance(exc.__cause__, TimeoutError):
                    raise self._slow() from exc.__cause__
                raise
        except BaseException as exc:
            await _give_back(pool, conn, exc)
            raise
        await release_committed(pool, conn)

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        pool = self.pool
        conn = await self._acquire()
        try:
            with refusals():
                rows = await _PostgresTx(conn).fetch(sql, *args)
        except BaseException as exc:
            await _give_back(pool, conn, exc)
            if isinstance(exc, DatabaseUnavailable) and isinstance(exc.__cause__, TimeoutError):
                raise self._slow() from exc.__cause__
            raise
        with contextlib.suppress(Exception):
            await pool.release(conn)
        return rows

    async def now(self) -> float:
        return float((await self.fetch(_PG_NOW))[0]["now"])


class SharedDatabase:
    """One Database several stores use through handles (`handle()`): the gateway's quota, hold and approval
    stores share one PostgreSQL pool of storage.pool_max_size connections, not one pool each. The first handle
    opened opens it, the last one closed closes it; a handle closed twice (or never opened) counts once (or
    not at all), so no store closes it under another. Their transactions are short and never nest (none
    waits for a second connection while it holds one), so one pool serves them all."""

    def __init__(self, base: Database) -> None:
        self.base = base
        self.kind = base.kind
        self.users = 0
        self._lock = asyncio.Lock()

    def handle(self) -> SharedHandle:
        return SharedHandle(self)

    async def _open(self) -> None:
        async with self._lock:
            if self.users == 0:
                await self.base.open()
            self.users += 1

    async def _close(self) -> None:
        async with self._lock:
            self.users -= 1
            if self.users == 0:
                await self.base.close()

    async def close_all(self) -> None:
        """Close it whoever still holds a handle (a start-up that failed half-way)."""
        async with self._lock:
            self.users = 0
            await self.base.close()


class SharedHandle:
    """A store's Database: a handle on a SharedDatabase (see there)."""

    def __init__(self, shared: SharedDatabase) -> None:
        self.shared = shared
        self.kind = shared.kind
        self._opened = False

    async def open(self) -> None:
        if not self._opened:
            await self.shared._open()
            self._opened = True

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            await self.shared._close()

    @property
    def pool(self) -> Any:
        """The shared asyncpg pool (PostgreSQL)."""
        base = self.shared.base
        if not isinstance(base, PostgresDatabase):
            raise AttributeError("a SQLite database has no pool")
        return base.pool

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Tx]:
        return self.shared.base.transaction()

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return await self.shared.base.fetch(sql, *args)

    async def now(self) -> float:
        return await self.shared.base.now()


# while set (`one_pool()`): the databases database() hands out, one per storage setting, shared
_SHARED: contextvars.ContextVar[dict[tuple[Any, ...], SharedDatabase] | None] = contextvars.ContextVar(
    "pvegate_shared_databases", default=None
)


@contextlib.asynccontextmanager
async def one_pool() -> AsyncIterator[None]:
    """Within it, `database(config)` on PostgreSQL gives handles on one shared pool (SharedDatabase) instead of
    a pool each: what a gateway process builds its stores in, so that it holds storage.pool_max_size
    connections for them all. Leaving it on an error closes the pool, whichever store had opened it."""
    shared: dict[tuple[Any, ...], SharedDatabase] = {}
    token = _SHARED.set(shared)
    try:
        yield
    except BaseException:
        for one in shared.values():
            with contextlib.suppress(Exception):
                await one.close_all()
        raise
    finally:
        _SHARED.reset(token)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _postgres(config: Config, read_only: bool) -> PostgresDatabase:
    assert config.storage.url is not None
    return PostgresDatabase(
        config.storage.url,
        config.storage.password,
        config.storage.pool_max_size,
        read_only=read_only,
        settings=REPLICA_SETTINGS,
    )


def database(config: Config, sqlite_path: Path | None = None, read_only: bool = False) -> Database:
    """The backend storage.url selects (not yet open); SQLite in the audit database file by default."""
    if config.storage.postgresql:
        assert config.storage.url is not None
        shared = _SHARED.get()
        key = (config.storage.url, config.storage.password, config.storage.pool_max_size, read_only)
        if shared is not None:  # one_pool(): the stores of one process share one pool
            if key not in shared:
                shared[key] = SharedDatabase(_postgres(config, read_only))
            return shared[key].handle()
        return _postgres(config, read_only)
    return SqliteDatabase(sqlite_path or config.audit_path, read_only=read_only)
