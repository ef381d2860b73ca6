"""Where the audit lives on PostgreSQL, and a blocking, sqlite3-shaped connection to it.

The operator side of the audit (verify, checkpoint, search, export, archive, reconciliation's
reads) is plain blocking code written against `sqlite3.Connection`: it runs in the CLI or in a
worker thread, one statement after the other. `PgConnection` gives it the same few calls on
PostgreSQL (asyncpg, driven by an event loop of its own, so it works in any thread that runs
no loop), so one body of code checks a chain on either backend:

- `execute(sql, params)` with `?` placeholders; a cursor with `fetchone`, `fetchall` and
  iteration (chunked through a server-side cursor inside a transaction: a long chain is never
  held in memory at once); rows answer both `row[0]` and `row["col"]`, like `sqlite3.Row`.
- `BEGIN` opens a REPEATABLE READ snapshot (verify reads the head and the records from one
  snapshot, as a SQLite read transaction does). `BEGIN IMMEDIATE` (SQLite: the one writer)
  takes an advisory lock (sealers and archivers take turns) and locks the chain's head row,
  so no gateway appends until COMMIT or ROLLBACK; later reads (READ COMMITTED) see the latest.
- A database error is raised as `PgError`, a `sqlite3.OperationalError`: the operator code
  already turns those into a sentence, and PostgreSQL's own message is kept. So is a server
  that cannot be reached (the socket's OSError, a timeout): the store is unavailable (the admin
  API's 503), never an internal error.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.config import Config, SecretRef
from gateway.store.db import SCHEMA_PROBE, pg_sql, pinned_search_path, refusal

CHUNK = 1000  # rows fetched per round trip while iterating a cursor


@dataclass(frozen=True)
class PgLocation:
    """The audit's PostgreSQL database: storage.url (which never holds a password) and its password."""

    url: str
    password: SecretRef | None = None

    def __str__(self) -> str:
        return self.url

    def read_password(self) -> str | None:
        return self.password.read() if self.password is not None else None


def audit_location(config: Config) -> Any:
    """Where storage.url puts the audit: a PgLocation, or the SQLite file (a Path)."""
    if config.storage.postgresql:
        assert config.storage.url is not None
        return PgLocation(config.storage.url, config.storage.password)
    return config.audit_path


class PgError(sqlite3.OperationalError):
    """A PostgreSQL error, raised where the operator code expects sqlite3's (its message kept)."""


class _Cursor:
    def __init__(self, conn: PgConnection, rows: list[Any] | None, cursor: Any = None) -> None:
        self._conn = conn
        self._rows = rows or []
        self._cursor = cursor  # an asyncpg server-side cursor, read in chunks

    def _more(self) -> bool:
        if self._cursor is None:
            return False
        chunk = self._conn._run(self._cursor.fetch(CHUNK))
        if len(chunk) < CHUNK:
            self._cursor = None
        self._rows.extend(chunk)
        return bool(chunk)

    def fetchone(self) -> Any:
        if not self._rows and not self._more():
            return None
        return self._rows.pop(0)

    def fetchall(self) -> list[Any]:
        while self._more():
            pass
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self) -> Iterator[Any]:
        while True:
            if not self._rows and not self._more():
                return
            rows, self._rows = self._rows, []
            yield from rows


class PgConnection:
    """A blocking connection for the operator-side audit code (see the module's docstring)."""

    kind = "postgresql"

    def __init__(self, location: PgLocation, *, readonly: bool = False, timeout: float = 30.0) -> None:
        import asyncpg

        self.readonly = readonly
        self._loop = asyncio.new_event_loop()
        self._tx: Any = None
        try:
            self._conn = self._run(
                asyncpg.connect(location.url, password=location.read_password(), timeout=timeout, command_timeout=300)
            )
            # the operator side compares through the catalog's operators too (db.SCHEMA_PROBE)
            pinned = pinned_search_path(self._run(self._conn.fetchval(SCHEMA_PROBE)))
            if pinned is not None:
                self._run(self._conn.execute("SELECT set_config('search_path', $1, false)", pinned))
        except BaseException:
            if getattr(self, "_conn", None) is not None:
                self._run_quiet(self._conn.close())
            self._loop.close()
            raise

    def _run_quiet(self, coro: Any) -> None:
        try:
            self._loop.run_until_complete(coro)
        except Exception:  # noqa: S110 - closing a connection whose setup failed: nothing left to do with it
            pass

    def _run(self, coro: Any) -> Any:
        import asyncpg

        try:
            return self._loop.run_until_complete(coro)
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise PgError(str(exc)) from exc
        except OSError as exc:  # refused, reset, unreachable, timed out (TimeoutError): the store's, not a bug
            raise PgError(refusal(exc) or f"PostgreSQL cannot be reached: {exc}") from exc

    @property
    def in_transaction(self) -> bool:
        return self._tx is not None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        word = sql.strip().split(None, 1)[0].upper() if sql.strip() else ""
        if word == "BEGIN":
            immediate = "IMMEDIATE" in sql.upper()
            iso = "read_committed" if immediate else "repeatable_read"
            self._tx = self._conn.transaction(isolation=iso, readonly=self.readonly and not immediate)
            self._run(self._tx.start())
            if immediate:  # the one writer: other sealers and archivers take turns, appends wait for the head row
                self._run(self._conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('pvegate_audit', 0))"))
                self._run(self._conn.execute("SELECT 1 FROM audit_meta WHERE key = 'head' FOR UPDATE"))
            return _Cursor(self, [])
        if word in ("COMMIT", "ROLLBACK"):
            tx, self._tx = self._tx, None
            if tx is not None:
                self._run(tx.commit() if word == "COMMIT" else tx.rollback())
            return _Cursor(self, [])
        text = pg_sql(sql)
        if word in ("SELECT", "WITH"):
            if self._tx is not None:
                return _Cursor(self, [], self._run(self._conn.cursor(text, *params)))
            return _Cursor(self, list(self._run(self._conn.fetch(text, *params))))
        self._run(self._conn.execute(text, *params))
        return _Cursor(self, [])

    def close(self) -> None:
        try:
            if self._tx is not None:
                tx, self._tx = self._tx, None
                self._run(tx.rollback())
            self._run(self._conn.close())
        except Exception:  # noqa: S110 - closing a broken connection: nothing left to do with it
            pass
        finally:
            self._loop.close()
