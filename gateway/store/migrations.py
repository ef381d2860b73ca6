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

from gateway.store.db import Database, Tx

VERSIONS_TABLE = "CREATE TABLE IF NOT EXISTS pvegate_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL)"


class SchemaError(Exception):
    """The database's schema is not the one this pvegate can use (one line: what to do)."""


def statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _known(migrations: dict[str, Sequence[str]], db: Database) -> Sequence[str]:
    return migrations[db.kind]


async def version(tx: Tx, component: str) -> int:
    rows = await tx.fetch("SELECT version FROM pvegate_schema WHERE component = ?", component)
    return int(rows[0]["version"]) if rows else 0


async def versions(db: Database) -> dict[str, int]:
    """Each component's recorded version, read without writing anything (`pvegate db status`)."""
    if db.kind == "sqlite":
        sql = "SELECT 1 AS present FROM sqlite_master WHERE type = 'table' AND name = 'pvegate_schema'"
    else:
        sql = "SELECT 1 AS present WHERE to_regclass('pvegate_schema') IS NOT NULL"
    if not await db.fetch(sql):
        return {}
    return {
        str(r["component"]): int(r["version"]) for r in await db.fetch("SELECT component, version FROM pvegate_schema")
    }


async def upgrade(db: Database, component: str, migrations: dict[str, Sequence[str]]) -> tuple[int, int]:
    """Apply the missing migrations in one transaction; (version before, version after)."""
    known = _known(migrations, db)
    async with db.transaction() as tx:
        await tx.lock("pvegate_schema")  # replicas upgrading at once take turns
        await tx.execute(VERSIONS_TABLE)
        before = await version(tx, component)
        if before > len(known):
            raise SchemaError(_newer(component, before, len(known)))
        for script in known[before:]:
            for stmt in statements(script):
                await tx.execute(stmt)
        if before < len(known):
            await tx.execute(
                "INSERT INTO pvegate_schema (component, version) VALUES (?, ?) "
                "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                component,
                len(known),
            )
    return before, len(known)


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
        before = int(row[0]) if row else 0
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
