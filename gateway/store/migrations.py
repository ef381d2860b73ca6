"""Versioned schema migrations of the stores, per backend, recorded in table `pvegate_schema`.

Each component (a store) has a list of migrations per backend; version N is the first N
applied. `pvegate db upgrade` applies what is missing. At start-up a store checks its version:
newer than this pvegate knows is refused (an older binary must not write a schema it does not
understand); older is applied on SQLite (one process owns the file, as before this table existed:
its version-1 SQL is the old `CREATE ... IF NOT EXISTS`) but refused on PostgreSQL, where several
replicas share the database and the operator upgrades it once, on purpose.

The audit log's SQLite writer owns a plain sqlite3 connection in a thread of its own: it applies
its migrations with `upgrade_sync`, the same rule on that connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from gateway.store.db import Database, Tx, quote_ident

VERSIONS_TABLE = "CREATE TABLE IF NOT EXISTS pvegate_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"


class SchemaError(Exception):
    """The database's schema is not the one this pvegate can use (one line: what to do)."""


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _known(migrations: dict[str, Sequence[str]], db: Database) -> Sequence[str]:
    return migrations[db.kind]


def number(component: str, value: object) -> int:
    """A recorded schema version; SchemaError when it is not a whole number (the table was edited by hand)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdecimal():  # SQLite keeps what it was given: '2' is 2
        return int(value.strip())
    raise SchemaError(
        f"the {component} schema version recorded in table pvegate_schema is {value!r}, not a number: the table "
        "was edited outside pvegate; restore the database from a backup (keep a copy of this one as evidence)"
    )


async def version(tx: Tx, component: str) -> int:
    rows = await tx.fetch("SELECT version FROM pvegate_schema WHERE component = ?", component)
    return number(component, rows[0]["version"]) if rows else 0


async def versions(db: Database) -> dict[str, int]:
    """Each component's recorded version, read without writing anything (`pvegate db status`)."""
    if db.kind == "sqlite":
        sql = "SELECT 1 AS present FROM sqlite_master WHERE type = 'table' AND name = 'pvegate_schema'"
    else:
        sql = "SELECT 1 AS present WHERE to_regclass('pvegate_schema') IS NOT NULL"
    if not await db.fetch(sql):
        return {}
    return {
        str(r["component"]): number(str(r["component"]), r["version"])
        for r in await db.fetch("SELECT component, version FROM pvegate_schema")
    }


async def upgrade(db: Database, component: str, migrations: dict[str, Sequence[str]]) -> tuple[int, int]:
    """Apply the missing migrations in one transaction; (version before, version after)."""
    known = _known(migrations, db)
    async with db.transaction() as tx:
        await tx.lock("pvegate_schema")  # replicas upgrading at once take turns
        pinned = await _creating(tx) if db.kind == "postgresql" else None
        await tx.execute(VERSIONS_TABLE)
        if pinned is not None:
            await _set_path(tx, pinned)
        before = await version(tx, component)
        if before > len(known):
            raise SchemaError(_newer(component, before, len(known)))
        if before < len(known) and pinned is not None:
            await _creating(tx)
        for script in known[before:]:
            for stmt in statements(script):
                await tx.execute(stmt)
        if pinned is not None:
            await _set_path(tx, pinned)
        if before < len(known):
            await tx.execute(
                "INSERT INTO pvegate_schema (component, version) VALUES (?, ?) "
                "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                component,
                len(known),
            )
    return before, len(known)


async def _set_path(tx: Tx, path: str) -> None:
    await tx.fetch("SELECT set_config('search_path', ?, true)", path)


async def _creating(tx: Tx) -> str | None:
    """PostgreSQL: for this transaction's DDL, name pvegate's schema first, so unqualified tables are made there and
    not in pg_catalog, which the sessions' pinned search_path (db.pinned_search_path) names first for reads.
    pg_catalog is left unnamed: PostgreSQL then searches it before every named schema, so a type, function or
    operator planted in pvegate's schema under a built-in's name (a domain `text`) is never bound into the tables
    made, while creation still goes to the first named schema.
    The search_path to go back to for the reads that follow; None: not pinned, nothing changed."""
    rows = await tx.fetch("SELECT current_setting('search_path') AS path, current_schemas(false) AS schemas")
    path, schemas = str(rows[0]["path"]), list(rows[0]["schemas"] or [])
    if len(schemas) < 2 or schemas[0] != "pg_catalog":
        return None
    await _set_path(tx, f"{quote_ident(str(schemas[1]))}, pg_temp")
    return path


def _newer(component: str, found: int, known: int) -> str:
    return (
        f"the {component} schema in the database is version {found}, newer than this pvegate knows ({known}): "
        "run the pvegate version that upgraded it"
    )


async def check(db: Database, component: str, migrations: dict[str, Sequence[str]]) -> int:
    """At start: refuse an unknown (newer) schema; SQLite applies an older one, PostgreSQL refuses it."""
    known = len(_known(migrations, db))
    if db.kind == "sqlite":
        return (await upgrade(db, component, migrations))[1]
    async with db.transaction() as tx:
        exists = await tx.fetch("SELECT to_regclass('pvegate_schema') IS NOT NULL AS present")
        found = await version(tx, component) if exists and exists[0]["present"] else 0
    if found > known:
        raise SchemaError(_newer(component, found, known))
    if found < known:
        raise SchemaError(
            f"the {component} schema in the database is version {found}, this pvegate needs {known}: "
            "run `pvegate db upgrade --config FILE` once (with every replica stopped or on the old version)"
        )
    return found


def upgrade_sync(con: sqlite3.Connection, component: str, known: Sequence[str]) -> tuple[int, int]:
    """`upgrade` on a blocking sqlite3 connection (autocommit mode): (version before, version after)."""
    con.execute("BEGIN IMMEDIATE")
    try:
        con.execute(VERSIONS_TABLE)
        row = con.execute("SELECT version FROM pvegate_schema WHERE component = ?", (component,)).fetchone()
        before = number(component, row[0]) if row else 0
        if before > len(known):
            raise SchemaError(_newer(component, before, len(known)))
        for script in known[before:]:
            for stmt in statements(script):
                con.execute(stmt)
        if before < len(known):
            con.execute(
                "INSERT INTO pvegate_schema (component, version) VALUES (?, ?) "
                "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                (component, len(known)),
            )
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.execute("ROLLBACK")
        raise
    return before, len(known)
