"""`pvegate db upgrade | status | migrate-from-sqlite`: the stores' schema versions in the database
storage.url names, and the move of a single-host installation into PostgreSQL."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from gateway.core.config import Config, load
from gateway.store.audit_seal import AuditKeyError, HeadKey
from gateway.store.db import Database, PostgresDatabase, SqliteDatabase, database
from gateway.store.migrations import SchemaError, versions
from gateway.store.schema import COMPONENTS, upgrade_all


def _where(db: Database) -> str:
    return "PostgreSQL" if db.kind == "postgresql" else f"SQLite {getattr(db, 'path', '')}"


# `pvegate db status` exit statuses (1: the database cannot be read, as every command's error)
STATUS_UPGRADE_NEEDED = 3
STATUS_NEWER = 4


class _Failed(Exception):
    """A one-line error for the operator."""


def _failure(exc: BaseException, kind: str) -> str | None:
    """What went wrong, as one sentence; None for an error that is a bug (it is shown with its traceback)."""
    from gateway.store.migrate import describe

    return describe(exc, local=kind == "sqlite")  # never "PostgreSQL cannot be reached" for a local file


async def _audit_created(db: PostgresDatabase) -> str | None:
    """The PostgreSQL audit chain's creation marker (None: not sealed yet, or no audit tables yet)."""
    if not await db.fetch("SELECT 1 AS present WHERE to_regclass('audit_meta') IS NOT NULL"):
        return None
    rows = await db.fetch("SELECT value FROM audit_meta WHERE key = 'created'")
    return str(rows[0]["value"]) if rows else None


async def _audit_fresh(db: PostgresDatabase) -> str | None:
    """The PostgreSQL audit chain's new-chain mark (None: none, the chain is sealed or has no tables)."""
    if not await db.fetch("SELECT 1 AS present WHERE to_regclass('audit_meta') IS NOT NULL"):
        return None
    rows = await db.fetch("SELECT value FROM audit_meta WHERE key = 'fresh'")
    return str(rows[0]["value"]) if rows else None


def _key_id(doc_text: str) -> str | None:
    """The key id a chain mark (`created`, a signed `fresh`) names, if any."""
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(doc_text).get("key_id") or "") or None
    return None


def _marked_by_another(key: HeadKey, created: str | None, fresh: str | None) -> str | None:
    """Why `key` opens nothing on this chain (sealed, or marked new, with another key), or None."""
    if created is not None:  # a replica sealed the chain meanwhile
        sealed_with = _key_id(created)
        if sealed_with is None or sealed_with == key.key_id:
            return None
        return f"the audit chain in the database was sealed with another audit head key (key id {sealed_with})"
    if fresh is None:
        return None
    with contextlib.suppress(ValueError):
        if key.check("fresh", json.loads(fresh)):
            return None
    return (
        "the new audit chain in the database was already marked by `pvegate db upgrade` with another audit "
        f"head key (key id {_key_id(fresh) or 'unknown'})"
    )


def _pg_head_key(cfg: Config, created: str | None) -> str:
    """PostgreSQL: the audit head key every replica shares. Made here, once, only for a chain not sealed yet
    (never by a replica); a sealed chain's key must be copied from where it is, a new one would not open it."""
    path = cfg.audit_key_path
    sealed_with: str | None = None
    if created is not None:
        with contextlib.suppress(ValueError, AttributeError):
            sealed_with = str(json.loads(created).get("key_id") or "") or None
    if path.exists():
        key = HeadKey.load(path)
        if sealed_with is not None and sealed_with != key.key_id:
            raise _Failed(
                f"the audit chain in the database was sealed with another audit head key (key id {sealed_with}); "
                f"{path} holds key id {key.key_id}: copy the key the replicas use to {path}"
            )
        return f"audit head key: {path} (key id {key.key_id})"
    if created is not None:
        raise _Failed(
            f"the audit chain in the database is already sealed (key id {sealed_with or 'unknown'}) and there is no "
            f"audit head key at {path}: copy the key from a replica (or your backup) there, mode 0600; a new key "
            "would not open the chain"
        )
    key, made = HeadKey.load_or_create(path)  # another upgrade may make it at the same moment
    if not made:
        return f"audit head key: {path} (key id {key.key_id})"
    return f"audit head key: generated {path} (key id {key.key_id}): copy it to every replica (0600), back it up"


def _versions(found: list[tuple[str, int, int]]) -> None:
    for name, before, after in found:
        print(f"{name}: version {before} -> {after}" if before != after else f"{name}: version {after}, up to date")


async def _upgrade_pg(db: PostgresDatabase, cfg: Config) -> int:
    await _open(db)
    try:
        try:
            created = await _audit_created(db)
        except Exception as exc:
            raise _Failed(f"cannot read the database: {_why(exc, db.kind)}") from exc
        # a sealed chain: its key must be here already (checked before anything is changed)
        key_line = _pg_head_key(cfg, created) if created is not None else None
        found = await _apply(db)
        if created is None:
            # a chain not sealed yet: its key, made only now (the database answered and took the schema),
            # signs the chain's mark as new: a replica seals only a chain marked so (audit.sign_fresh)
            from gateway.store.audit import sign_fresh

            made = not cfg.audit_key_path.exists()
            key_line = _pg_head_key(cfg, None)
            key = HeadKey.load(cfg.audit_key_path)
            try:
                await sign_fresh(db, key)
                # signed by this key, or already by another `db upgrade` (another host, or one at the same
                # moment): a key that did not sign the mark opens nothing, and must not be handed out
                created, fresh = await _audit_created(db), await _audit_fresh(db)
            except AuditKeyError:
                raise
            except Exception as exc:
                raise _Failed(f"the new audit chain's mark was not signed: {_why(exc, db.kind)}") from exc
            if (problem := _marked_by_another(key, created, fresh)) is not None:
                if made:
                    with contextlib.suppress(OSError):
                        cfg.audit_key_path.unlink()
                path = cfg.audit_key_path
                where = f"there was no audit head key at {path}" if made else f"{path} holds key id {key.key_id}"
                raise _Failed(
                    f"{problem}; {where}: copy the key the other host made there (mode 0600) and run "
                    "`pvegate db upgrade` again"
                )
    finally:
        await db.close()
    _versions(found)
    print(key_line)
    return 0


async def _upgrade_sqlite(db: SqliteDatabase, cfg: Config) -> int:
    """A new file is sealed as the gateway's first start would (so that start finds a chain it may open);
    an upgrade that fails leaves no new file behind (an empty, unsealed one would look emptied)."""
    from gateway.store.audit import AuditIntegrityError, open_seal
    from gateway.store.audit_seal import mark_path, write_mark

    path, key_path = db.path, cfg.audit_key_path
    new_file, new_dir, new_key = not path.exists(), not path.parent.exists(), not key_path.exists()
    if new_file and not new_key:
        HeadKey.load(key_path)  # the key first, as the gateway: a start that fails on it leaves no file
    try:
        await _open(db)
        try:
            found = await _apply(db)
        finally:
            await db.close()
        if new_file:
            try:
                seal = await asyncio.to_thread(open_seal, path, key_path, new_file=True)
            except (AuditKeyError, AuditIntegrityError):
                raise
            except Exception as exc:
                raise _Failed(f"the new audit chain cannot be sealed: {_why(exc, db.kind)}") from exc
            with contextlib.suppress(OSError):  # as the gateway: a mark that cannot be written is not fatal
                head = seal.head[0] if seal.head else 0
                write_mark(mark_path(key_path), seal.key, seal.db_id, head, seal.head_hash if seal.head else None)
    except BaseException:
        if new_file:
            _remove_new(path, new_dir, key_path if new_key else None)
        raise
    _versions(found)
    if new_file:
        made = " (generated: back it up)" if new_key else ""
        print(f"audit: sealed the new audit chain (database {seal.db_id}) with the head key {key_path}{made}")
    return 0


async def _apply(db: Database) -> list[tuple[str, int, int]]:
    """The missing migrations, on an open database; a failure other than a schema's is one line."""
    try:
        return await upgrade_all(db)
    except SchemaError:
        raise
    except Exception as exc:
        raise _Failed(f"the upgrade failed: {_why(exc, db.kind)}") from exc


def _remove_new(path: Path, new_dir: bool, new_key: Path | None) -> None:
    """What a failed upgrade created: the database file (with its -wal/-shm/-journal), a key made for it."""
    from gateway.store.audit_seal import mark_path

    made = [path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))]
    if new_key is not None:
        made += [new_key, mark_path(new_key)]
    for file in made:
        with contextlib.suppress(OSError):
            file.unlink()
    if new_dir:
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only if it is empty


async def _open(db: Database) -> None:
    try:
        await db.open()
    except Exception as exc:
        why = _failure(exc, db.kind)
        if why is None:
            raise
        raise _Failed(f"cannot open the database: {why}") from exc


def _why(exc: BaseException, kind: str) -> str:
    why = _failure(exc, kind)
    if why is None:
        raise exc
    if kind == "postgresql" and _sqlstate(exc) == "42P07":
        why += " (the database holds a table pvegate did not make: give pvegate a database of its own)"
    return why


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", "") or "")


async def _status(db: Database) -> int:
    """Read-only: the connection cannot write (SQLite mode=ro, PostgreSQL read-only transactions)."""
    found: dict[str, int] = {}
    if isinstance(db, SqliteDatabase) and not db.path.exists():
        print(f"(no database file at {db.path} yet)")
    else:
        await _open(db)
        try:
            found = await versions(db)
        except Exception as exc:
            raise _Failed(f"cannot read the database: {_why(exc, db.kind)}") from exc
        finally:
            await db.close()
    rc = 0
    for name, migrations in COMPONENTS[db.kind].items():
        have, known = found.get(name, 0), len(migrations[db.kind])
        if have > known:
            state, rc = "NEWER than this pvegate", STATUS_NEWER
        elif have < known:
            state, rc = "upgrade needed", max(rc, STATUS_UPGRADE_NEEDED)
        else:
            state = "up to date"
        print(f"{name}: version {have} (this pvegate: {known}): {state}")
    return rc


def _run(args: argparse.Namespace) -> int:
    from gateway.store.audit import AuditIntegrityError

    cfg = load(args.config)
    db = database(cfg, read_only=args.db_command == "status")
    print(f"database: {_where(db)}")
    if isinstance(db, SqliteDatabase) and db.path.is_dir():  # SQLite would say only "disk I/O error"
        print(f"error: {db.path} is a directory, not an audit database (audit.path)", file=sys.stderr)
        return 1
    try:
        if args.db_command == "status":
            return asyncio.run(_status(db))
        if isinstance(db, PostgresDatabase):
            return asyncio.run(_upgrade_pg(db, cfg))
        assert isinstance(db, SqliteDatabase)
        return asyncio.run(_upgrade_sqlite(db, cfg))
    except (_Failed, SchemaError, AuditKeyError, AuditIntegrityError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # the reader went away (`db status | head -1`): main() ends quietly
    except Exception as exc:  # anything else the backend says, as one line
        why = _failure(exc, db.kind)
        if why is None:
            raise
        print(f"error: {why}", file=sys.stderr)
        return 1


def _migrate(args: argparse.Namespace) -> int:
    from gateway.store.migrate import MigrateError, describe, migrate_from_sqlite

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
    except BrokenPipeError:
        raise
    except Exception as exc:  # before the PostgreSQL commit (after it, migrate_from_sqlite says so itself)
        why = describe(exc)
        if why is None:
            raise
        print(f"error: the move failed, nothing was kept in PostgreSQL: {why}", file=sys.stderr)
        return 1
    print(
        f"moved {result.records} audit records (chain intact up to record {result.last_seq}), "
        f"{result.approvals} approval requests and {result.votes} votes into PostgreSQL"
    )
    shared = result.shared
    print(
        f"and the shared state: {shared.get('pvegate_keys', 0)} request-state key(s), "
        f"{shared.get('console_signouts', 0)} console session sign-outs, "
        f"{shared.get('console_person_signouts', 0)} person sign-outs, "
        f"{shared.get('request_state_uses', 0)} used requestState nonces, "
        f"{shared.get('request_handoffs', 0)} retry handoffs "
        "(quota counters and pool holds are kept per process on SQLite: they start afresh)"
    )
    print("next: point every replica's storage.url at it, give each the audit head key, start them")
    return 0


def register(sub: Any) -> None:
    d = sub.add_parser(
        "db",
        help="the database's schema: upgrade it, show its versions; move a single-host (SQLite) installation "
        "into PostgreSQL (migrate-from-sqlite)",
    )
    dsub = d.add_subparsers(dest="db_command", required=True)
    for name, text in (
        (
            "upgrade",
            "apply the missing schema migrations (once per database; every replica checks at start); on "
            "PostgreSQL, make the audit head key if the database's chain is not sealed yet; on a new SQLite "
            "file, seal its audit chain as the gateway's first start would",
        ),
        (
            "status",
            f"show each store's schema version and whether it needs an upgrade (exit status 0: up to date, "
            f"{STATUS_UPGRADE_NEEDED}: an upgrade is needed, {STATUS_NEWER}: a schema is newer than this pvegate, "
            "1: the database cannot be read)",
        ),
    ):
        p = dsub.add_parser(name, help=text)
        p.add_argument("--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway's pvegate.yaml")
        p.set_defaults(func=_run)
    m = dsub.add_parser(
        "migrate-from-sqlite",
        help="move a single-host installation's audit (chain verified before and after, against its high-water "
        "mark too), approvals, request-state key, used requestState nonces, retry handoffs and console "
        "sign-outs into the PostgreSQL database storage.url names (stop the gateway first)",
    )
    m.add_argument(
        "--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the configuration naming PostgreSQL"
    )
    m.add_argument("--from", dest="source", required=True, help="the SQLite audit database: sqlite:///PATH or a path")
    m.add_argument(
        "--key",
        type=Path,
        help="the SQLite audit's head key (default: audit-head.key next to it; the chain is checked against the "
        "high-water mark next to the key); copied to audit.head_key_file after the move when that file does not "
        "exist, and the mark written next to it",
    )
    m.add_argument("--archive", action="append", help="its archive files, oldest first, if it was archived")
    m.add_argument(
        "--replace-target",
        action="store_true",
        help="delete what the PostgreSQL database already holds (audit, approvals, the shared state) instead of "
        "refusing",
    )
    m.set_defaults(func=_migrate)
