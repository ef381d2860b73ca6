"""`pvegate db upgrade | status | migrate-from-sqlite`: the stores' schema versions in the database
storage.url names, and the move of a single-host installation into PostgreSQL."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from gateway.core.config import Config, load
from gateway.store.audit_seal import AuditKeyError
from gateway.store.db import Database, DatabaseUnavailable, SqliteDatabase, database
from gateway.store.migrations import SchemaError, versions
from gateway.store.schema import COMPONENTS, upgrade_all


def _where(db: Database) -> str:
    return "PostgreSQL" if db.kind == "postgresql" else f"SQLite {getattr(db, 'path', '')}"


def _head_key(cfg: Config) -> None:
    """PostgreSQL: the audit head key every replica shares, made once here (never by a replica)."""
    from gateway.store.audit_seal import HeadKey

    path = cfg.audit_key_path
    if path.exists():
        print(f"audit head key: {path} (key id {HeadKey.load(path).key_id})")
        return
    key = HeadKey.create(path)
    print(f"audit head key: generated {path} (key id {key.key_id}): copy it to every replica (0600), back it up")


async def _upgrade(db: Database) -> int:
    await db.open()
    try:
        for name, before, after in await upgrade_all(db):
            print(f"{name}: version {before} -> {after}" if before != after else f"{name}: version {after}, up to date")
    finally:
        await db.close()
    return 0


async def _status(db: Database) -> int:
    """Read-only: the connection cannot write (SQLite mode=ro, PostgreSQL read-only transactions)."""
    found: dict[str, int] = {}
    if isinstance(db, SqliteDatabase) and not db.path.exists():
        print(f"(no database file at {db.path} yet)")
    else:
        await db.open()
        try:
            found = await versions(db)
        finally:
            await db.close()
    for name, migrations in COMPONENTS[db.kind].items():
        have, known = found.get(name, 0), len(migrations[db.kind])
        state = "up to date" if have == known else ("NEWER than this pvegate" if have > known else "upgrade needed")
        print(f"{name}: version {have} (this pvegate: {known}): {state}")
    return 0


def _run(args: argparse.Namespace) -> int:
    cfg = load(args.config)
    db = database(cfg, read_only=args.db_command == "status")
    print(f"database: {_where(db)}")
    try:
        if args.db_command == "upgrade" and db.kind == "postgresql":
            _head_key(cfg)
        return asyncio.run(_upgrade(db) if args.db_command == "upgrade" else _status(db))
    except (SchemaError, AuditKeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, DatabaseUnavailable) as exc:  # the server is not reachable, the file cannot be created
        print(f"error: cannot open the database: {exc}", file=sys.stderr)
        return 1


def _migrate(args: argparse.Namespace) -> int:
    import asyncpg

    from gateway.store.migrate import MigrateError, migrate_from_sqlite

    source = Path(str(args.source).removeprefix("sqlite://"))
    try:
        cfg = load(args.config)
        result = asyncio.run(
            migrate_from_sqlite(
                source,
                cfg,
                source_key=args.key,
                archives=[Path(a) for a in args.archive or []],
                replace=args.replace_target,
                say=print,
            )
        )
    except (MigrateError, AuditKeyError, SchemaError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"error: the move failed, nothing was kept in PostgreSQL: {exc}", file=sys.stderr)
        return 1
    print(
        f"moved {result.records} audit records (chain intact up to record {result.last_seq}), "
        f"{result.approvals} approval requests and {result.votes} votes into PostgreSQL"
    )
    print("next: point every replica's storage.url at it, give each the audit head key, start them")
    return 0


def register(sub: Any) -> None:
    d = sub.add_parser("db", help="the database's schema: upgrade it, show its versions")
    dsub = d.add_subparsers(dest="db_command", required=True)
    for name, text in (
        ("upgrade", "apply the missing schema migrations (once per database; every replica checks at start)"),
        ("status", "show each store's schema version and whether it needs an upgrade"),
    ):
        p = dsub.add_parser(name, help=text)
        p.add_argument("--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway's pvegate.yaml")
        p.set_defaults(func=_run)
    m = dsub.add_parser(
        "migrate-from-sqlite",
        help="move a single-host installation's audit (chain verified before and after) and approvals into "
        "the PostgreSQL database storage.url names (stop the gateway first)",
    )
    m.add_argument(
        "--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the configuration naming PostgreSQL"
    )
    m.add_argument("--from", dest="source", required=True, help="the SQLite audit database: sqlite:///PATH or a path")
    m.add_argument(
        "--key",
        type=Path,
        help="the SQLite audit's head key (default: audit-head.key next to it); copied to audit.head_key_file "
        "when that file does not exist",
    )
    m.add_argument("--archive", action="append", help="its archive files, oldest first, if it was archived")
    m.add_argument(
        "--replace-target",
        action="store_true",
        help="delete what the PostgreSQL database already holds (audit, approvals) instead of refusing",
    )
    m.set_defaults(func=_migrate)
