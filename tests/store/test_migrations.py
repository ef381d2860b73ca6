"""Versioned schemas: `pvegate db upgrade` applies them, a store refuses a schema it does not know."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.store import approvals, audit, handoffs, shared_keys, usage
from gateway.store.approvals import ApprovalStore
from gateway.store.db import Database, PostgresDatabase
from gateway.store.holds import SqlHolds
from gateway.store.migrations import SchemaError
from gateway.store.schema import upgrade_all
from gateway.store.usage import SqlQuotas
from tests.config.conftest import minimal, run_pvegate, write
from tests.pgserver import PostgresServer


async def fresh_pg(server: PostgresServer) -> str:
    return await server.create_database("m_")


async def test_upgrade_is_versioned_and_idempotent(make_database: Callable[[], Database], backend: str) -> None:
    db = make_database()
    await db.open()
    try:
        first = await upgrade_all(db)
        again = await upgrade_all(db)
    finally:
        await db.close()
    # the PostgreSQL fixture has upgraded already (as an operator would); SQLite starts empty
    expected_first = (
        [("audit", 0, 1), ("approvals", 0, 1), ("keys", 0, 1), ("handoffs", 0, 3)]
        if backend == "sqlite"
        else [
            ("audit", 1, 1),
            ("approvals", 1, 1),
            ("usage", 1, 1),
            ("holds", 1, 1),
            ("keys", 1, 1),
            ("handoffs", 3, 3),
        ]
    )
    assert first == expected_first
    assert all(before == after == (3 if name == "handoffs" else 1) for name, before, after in again)


async def test_a_newer_schema_is_refused(make_database: Callable[[], Database]) -> None:
    """An older pvegate must not write a schema a newer one made: refused at open and at upgrade."""
    store = ApprovalStore(make_database())
    await store.open()
    async with store.database.transaction() as tx:
        await tx.execute("UPDATE pvegate_schema SET version = 99 WHERE component = 'approvals'")
    await store.close()
    with pytest.raises(SchemaError, match="approvals schema in the database is version 99, newer than this pvegate"):
        await ApprovalStore(make_database()).open()
    db = make_database()
    await db.open()
    try:
        with pytest.raises(SchemaError, match="newer"):
            await upgrade_all(db)
    finally:
        await db.close()


async def test_postgresql_refuses_a_database_not_yet_upgraded(postgres: PostgresServer) -> None:
    dsn = await fresh_pg(postgres)
    with pytest.raises(SchemaError, match=r"version 0, this pvegate needs 1: run `pvegate db upgrade"):
        await ApprovalStore(PostgresDatabase(dsn)).open()
    with pytest.raises(SchemaError, match="usage schema"):
        await SqlQuotas(PostgresDatabase(dsn)).open()
    with pytest.raises(SchemaError, match="holds schema"):
        await SqlHolds(PostgresDatabase(dsn)).open()
    db = PostgresDatabase(dsn)
    await db.open()
    try:
        assert await upgrade_all(db) == [
            ("audit", 0, 1),
            ("approvals", 0, 1),
            ("usage", 0, 1),
            ("holds", 0, 1),
            ("keys", 0, 1),
            ("handoffs", 0, 3),
        ]
    finally:
        await db.close()
    store = ApprovalStore(PostgresDatabase(dsn))
    await store.open()  # now it starts
    await store.close()


async def test_a_sqlite_file_from_before_versioning_is_taken_over(tmp_path: Path) -> None:
    """Existing users: the tables the old CREATE IF NOT EXISTS made, with a row, become version 1."""
    path = tmp_path / "audit.db"
    with sqlite3.connect(path) as old:
        old.executescript(approvals.SQLITE_V1)
        old.execute(
            "INSERT INTO approval_requests (id, created_at, request_id, requester, requester_facts, tool, tool_facts, "
            "arguments_digest, arguments, target_key, target, risk, reason, approver_groups, min_approvals, "
            "ttl_seconds, expires_at, state) VALUES ('apr-old', ?, 'r', 'agent', '{}', 't', '{}', 'd', '{}', 'k', "
            "'{}', '{}', 'why', '[]', 1, 60, ?, 'pending')",
            (time.time(), time.time() + 60),
        )
    store = ApprovalStore(path)
    await store.open()
    try:
        assert (await store.get("apr-old")).state == "pending"
        rows = await store.database.fetch("SELECT component, version FROM pvegate_schema")
        assert rows == [{"component": "approvals", "version": 1}]
    finally:
        await store.close()


def _config(tmp_path: Path, storage: dict[str, Any] | None) -> Path:
    raw = minimal(tmp_path)
    if storage:
        raw["storage"] = storage
    return write(tmp_path, raw)


async def test_db_upgrade_and_status_commands(postgres: PostgresServer, tmp_path: Path) -> None:
    path = _config(tmp_path, {"url": await fresh_pg(postgres)})
    r = run_pvegate("db", "status", "--config", str(path))
    assert r.returncode == 3, r.stderr  # an upgrade is needed
    assert "approvals: version 0 (this pvegate: 1): upgrade needed" in r.stdout
    r = run_pvegate("db", "upgrade", "--config", str(path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "database: PostgreSQL"
    assert lines[1:7] == [
        "audit: version 0 -> 1",
        "approvals: version 0 -> 1",
        "usage: version 0 -> 1",
        "holds: version 0 -> 1",
        "keys: version 0 -> 1",
        "handoffs: version 0 -> 3",
    ]
    # the audit head key every replica shares is made here, once, after the database took the schema
    # (a replica never makes one)
    assert lines[7].startswith(f"audit head key: generated {tmp_path / 'state' / 'audit-head.key'}")
    r = run_pvegate("db", "upgrade", "--config", str(path))
    lines = r.stdout.splitlines()
    assert lines[7].startswith("audit head key: ") and "generated" not in lines[7]
    assert lines[1:7] == [
        "audit: version 1, up to date",
        "approvals: version 1, up to date",
        "usage: version 1, up to date",
        "holds: version 1, up to date",
        "keys: version 1, up to date",
        "handoffs: version 3, up to date",
    ]
    r = run_pvegate("db", "status", "--config", str(path))
    assert r.returncode == 0, r.stderr
    assert "approvals: version 1 (this pvegate: 1): up to date" in r.stdout

    sqlite_cfg = _config(tmp_path / "s", None)  # the default: the audit database file
    r = run_pvegate("db", "upgrade", "--config", str(sqlite_cfg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:5] == [
        "audit: version 0 -> 1",
        "approvals: version 0 -> 1",
        "keys: version 0 -> 1",
        "handoffs: version 0 -> 3",
    ]
    # a new file is sealed as the gateway's first start would (its key made, as that start makes it)
    assert r.stdout.splitlines()[5].startswith("audit: sealed the new audit chain"), r.stdout
    assert (tmp_path / "s" / "state" / "audit.db").exists()
    r = run_pvegate("db", "status", "--config", str(sqlite_cfg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1:] == [
        "audit: version 1 (this pvegate: 1): up to date",
        "approvals: version 1 (this pvegate: 1): up to date",
        "keys: version 1 (this pvegate: 1): up to date",
        "handoffs: version 3 (this pvegate: 3): up to date",
    ]


async def test_db_status_is_read_only(postgres: PostgresServer, tmp_path: Path) -> None:
    """A status command writes nothing: not the versions table, not a new SQLite file."""
    dsn = await fresh_pg(postgres)
    r = run_pvegate("db", "status", "--config", str(_config(tmp_path, {"url": dsn})))
    assert r.returncode == 3, r.stderr  # an upgrade is needed
    assert "keys: version 0 (this pvegate: 1): upgrade needed" in r.stdout
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('pvegate_schema')") is None
    finally:
        await conn.close()

    sqlite_cfg = _config(tmp_path / "s", None)
    audit_db = tmp_path / "s" / "state" / "audit.db"
    r = run_pvegate("db", "status", "--config", str(sqlite_cfg))
    assert r.returncode == 3, r.stderr
    assert "approvals: version 0 (this pvegate: 1): upgrade needed" in r.stdout
    assert not audit_db.exists() and not audit_db.parent.exists()
    audit_db.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(audit_db)) as db:  # a file from before versioning
        db.execute("CREATE TABLE approval_requests (id TEXT PRIMARY KEY)")
        db.commit()
    before = audit_db.read_bytes()
    r = run_pvegate("db", "status", "--config", str(sqlite_cfg))
    assert r.returncode == 3, r.stderr
    assert "approvals: version 0 (this pvegate: 1): upgrade needed" in r.stdout
    assert audit_db.read_bytes() == before
    with contextlib.closing(sqlite3.connect(audit_db)) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'pvegate_schema'").fetchall() == []


def test_db_upgrade_says_why_it_cannot_reach_the_server(tmp_path: Path) -> None:
    path = _config(tmp_path, {"url": "postgresql://pvegate@127.0.0.1:9/nowhere"})
    r = run_pvegate("db", "upgrade", "--config", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: cannot open the database:"), r.stderr


def test_usage_and_approvals_migrations_cover_both_backends() -> None:
    for migrations in (
        audit.MIGRATIONS,
        approvals.MIGRATIONS,
        usage.MIGRATIONS,
        shared_keys.MIGRATIONS,
        handoffs.MIGRATIONS,
    ):
        assert set(migrations) == {"sqlite", "postgresql"}
        assert len(migrations["sqlite"]) == len(migrations["postgresql"])
