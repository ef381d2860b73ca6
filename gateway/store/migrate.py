"""`pvegate db migrate-from-sqlite`: move a single-host installation's audit and approvals into PostgreSQL.

The audit moves as it is: every record with its seq, time, hashes and body text, and the
authenticated documents in audit_meta (creation marker, head, archive anchor and list) with
their MACs. So the chain is the same chain, under the same database id and the same head key:
checkpoints taken before the move still hold, archives made before it still verify before it.

In order, and nothing is written to PostgreSQL until the first three hold:
1. the head key: the configuration's (`audit.head_key_file`) must be the key the SQLite chain was
   sealed with; if that file does not exist yet, the SQLite installation's key is copied there;
2. the SQLite chain verifies (with its archives, if it was archived);
3. the target is empty (no audit record, no sealed chain, no approval), unless `replace`;
then, in one PostgreSQL transaction, the rows are copied from one SQLite snapshot; finally the
chain is verified again on PostgreSQL and must end at the same record with the same hash, and the
SQLite head must not have moved meanwhile (a gateway still writing it would lose records).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.core.config import Config
from gateway.store import audit as auditlib
from gateway.store.audit_seal import HeadKey
from gateway.store.db import PostgresDatabase
from gateway.store.pgsync import PgLocation, audit_location
from gateway.store.schema import upgrade_all

CHUNK = 5000  # audit rows per COPY
APPROVAL_TABLES = ("approval_requests", "approval_votes")  # parents first
SKIP_META = ("probe", "fresh")  # a process's last probe time; the new-chain marker of the empty target


class MigrateError(Exception):
    """The move cannot be made, or did not hold (one sentence: what to do)."""


@dataclass
class MigrateResult:
    records: int
    last_seq: int | None
    head_hash: str | None
    approvals: int
    votes: int
    key_copied_to: Path | None


def _key(source_key: Path, target_key: Path) -> tuple[HeadKey, Path | None]:
    src = HeadKey.load(source_key)
    if target_key.exists():
        dst = HeadKey.load(target_key)
        if dst.key_id != src.key_id:
            raise MigrateError(
                f"the configuration's audit head key {target_key} (key id {dst.key_id}) is not the key the SQLite "
                f"audit was sealed with ({source_key}, key id {src.key_id}): point audit.head_key_file at that key, "
                "or remove the other file"
            )
        return dst, None
    target_key.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, source_key.read_bytes())
        os.fsync(fd)
    finally:
        os.close(fd)
    return HeadKey.load(target_key), target_key


def _sqlite_head(path: Path) -> str | None:
    con = auditlib.connect(path, readonly=True)
    try:
        row = con.execute("SELECT value FROM audit_meta WHERE key = 'head'").fetchone()
        return None if row is None else str(row[0])
    finally:
        con.close()


async def _pg_columns(conn: Any, table: str) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
        table,
    )
    return {str(r["column_name"]): str(r["data_type"]) for r in rows}


def _converter(pg_type: str) -> Callable[[Any], Any]:
    if pg_type in ("double precision", "real", "numeric"):
        return lambda v: None if v is None else float(v)
    if pg_type in ("integer", "bigint", "smallint"):
        return lambda v: None if v is None else int(v)
    if pg_type == "boolean":
        return lambda v: None if v is None else bool(v)
    return lambda v: None if v is None else str(v)


async def _target_state(conn: Any) -> list[str]:
    """What the target already holds (empty: nothing)."""
    found = []
    n = await conn.fetchval("SELECT count(*) FROM audit")
    if n:
        found.append(f"{n} audit records")
    if await conn.fetchval("SELECT count(*) FROM audit_meta WHERE key = 'created'"):
        found.append("a sealed audit chain")
    n = await conn.fetchval("SELECT count(*) FROM approval_requests")
    if n:
        found.append(f"{n} approval requests")
    return found


async def migrate_from_sqlite(
    source: Path,
    config: Config,
    *,
    source_key: Path | None = None,
    archives: list[Path] | None = None,
    replace: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> MigrateResult:
    target = audit_location(config)
    if not isinstance(target, PgLocation):
        raise MigrateError("storage.url in the configuration is not a postgresql:// URL: nothing to move to")
    if not await asyncio.to_thread(source.is_file):
        raise MigrateError(f"there is no SQLite audit database at {source}")
    src_key_path = source_key or source.parent / "audit-head.key"
    key, copied = await asyncio.to_thread(_key, src_key_path, config.audit_key_path)
    if copied is not None:
        say(f"copied the audit head key {src_key_path} to {copied} (key id {key.key_id}): give it to every replica")
    checked = await asyncio.to_thread(auditlib.verify, source, archives or [], key=config.audit_key_path)
    if not checked.ok:
        raise MigrateError(f"the SQLite audit does not verify, nothing was moved: {checked.problem}")
    say(f"SQLite audit verified: {checked.checked} records, head record {checked.last_seq}")
    head_before = await asyncio.to_thread(_sqlite_head, source)

    db = PostgresDatabase(target.url, target.password)
    await db.open()
    try:
        await upgrade_all(db)
        async with db.pool.acquire() as conn, conn.transaction():
            # sealers and archivers take this lock too (store/pgsync.py): nobody seals the target meanwhile
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('pvegate_audit', 0))")
            held = await _target_state(conn)
            if held and not replace:
                raise MigrateError(
                    f"the PostgreSQL database already holds {', '.join(held)}: nothing was moved "
                    "(use --replace-target to delete them first, after keeping what you need)"
                )
            if held:
                say(f"deleting what the target held: {', '.join(held)}")
            for table in ("approval_votes", "approval_requests", "audit", "audit_meta", "audit_replicas"):
                await conn.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
            result = await asyncio.to_thread(_read_source, source)
            await _copy(conn, result)
        copied_rows = len(result["audit"])
    finally:
        await db.close()

    after = await asyncio.to_thread(auditlib.verify, target, archives or [], key=config.audit_key_path)
    if not after.ok:
        raise MigrateError(f"the audit on PostgreSQL does not verify after the move: {after.problem}")
    if (after.last_seq, after.head_hash) != (checked.last_seq, checked.head_hash):
        raise MigrateError(
            f"the audit on PostgreSQL ends at record {after.last_seq}, the SQLite one at {checked.last_seq}: "
            "the SQLite audit was written during the move (stop the gateway), run again with --replace-target"
        )
    if await asyncio.to_thread(_sqlite_head, source) != head_before:
        raise MigrateError(
            "the SQLite audit was written during the move (a gateway still runs on it): stop it, then run "
            "again with --replace-target"
        )
    say(f"PostgreSQL audit verified: {after.checked} records, head record {after.last_seq}, hash {after.head_hash}")
    return MigrateResult(
        copied_rows,
        after.last_seq,
        after.head_hash,
        len(result.get("approval_requests", [])),
        len(result.get("approval_votes", [])),
        copied,
    )


def _read_source(source: Path) -> dict[str, Any]:
    """Everything to move, from one snapshot of the SQLite file."""
    con = auditlib.connect(source, readonly=True)
    try:
        con.execute("BEGIN")
        out: dict[str, Any] = {
            "audit": [tuple(r[c] for c in auditlib.COLUMNS) for r in con.execute("SELECT * FROM audit ORDER BY seq")],
            "meta": [(str(k), str(v)) for k, v in con.execute("SELECT key, value FROM audit_meta")],
        }
        for table in APPROVAL_TABLES:
            try:
                cur = con.execute(f"SELECT * FROM {table}")  # noqa: S608 - fixed table names
            except sqlite3.OperationalError:  # an installation that never opened the approval store
                continue
            out[table] = [dict(r) for r in cur]
        con.execute("COMMIT")
        return out
    finally:
        con.close()


async def _copy(conn: Any, src: dict[str, Any]) -> None:
    rows = src["audit"]
    for i in range(0, len(rows), CHUNK):
        chunk = [
            (int(r[0]), float(r[1]), *r[2:]) for r in rows[i : i + CHUNK]
        ]  # seq and ts with PostgreSQL's types, the text columns as stored (the hashes cover them)
        await conn.copy_records_to_table("audit", records=chunk, columns=list(auditlib.COLUMNS))
    for key, value in src["meta"]:
        if key not in SKIP_META:
            await conn.execute("INSERT INTO audit_meta (key, value) VALUES ($1, $2)", key, value)
    for table in APPROVAL_TABLES:
        found = src.get(table) or []
        if not found:
            continue
        pg = await _pg_columns(conn, table)
        missing = [c for c in found[0] if c not in pg]
        if missing:
            raise MigrateError(f"{table} in the SQLite file has columns PostgreSQL's has not: {', '.join(missing)}")
        cols = [c for c in pg if c in found[0]]
        conv = [_converter(pg[c]) for c in cols]
        records = [tuple(f(r[c]) for f, c in zip(conv, cols, strict=True)) for r in found]
        await conn.copy_records_to_table(table, records=records, columns=cols)
