"""`pvegate db migrate-from-sqlite`: move a single-host installation's audit, approvals and shared state
into PostgreSQL.

The audit moves as it is: every record with its seq, time, hashes and body text, and the
authenticated documents in audit_meta (creation marker, head, archive anchor and list) with
their MACs. So the chain is the same chain, under the same database id and the same head key:
checkpoints taken before the move still hold, archives made before it still verify before it.
The rest of what the file shares moves with it: approval requests and votes, the request-state
key (pvegate_keys), used requestState nonces, retry handoffs and console sign-outs, so a
signed-out console session stays signed out and a used requestState stays used.

In order, and nothing is written to PostgreSQL until the first three hold:
1. the head key: the SQLite installation's (`--key`, default `audit-head.key` next to the file);
   if the configuration's (`audit.head_key_file`) exists, it must be the same key;
2. with the SQLite file's write lock held (BEGIN IMMEDIATE, until the PostgreSQL commit: a gateway
   still running cannot add records the move would miss), the SQLite chain verifies (with its
   archives, if it was archived) against the source key and the high-water mark next to it, and
   against the mark next to the configuration's key when that is another file;
3. the target is empty (no audit record, no sealed chain, no approval, no shared state), unless
   `replace`;
then, in one PostgreSQL transaction, the rows are copied from one SQLite snapshot; then the chain
is verified again on PostgreSQL and must end at the same record with the same hash, and the SQLite
head must not have moved meanwhile. Only then is the key copied to `audit.head_key_file` (when that
file does not exist) and the high-water mark carried next to it (docs/audit.md).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.core.config import Config
from gateway.store import audit as auditlib
from gateway.store.audit_seal import AuditKeyError, HeadKey, MarkError, mark_path, read_mark, write_mark
from gateway.store.db import DatabaseUnavailable, PostgresDatabase, refusal
from gateway.store.migrations import SchemaError
from gateway.store.pgsync import PgLocation, audit_location
from gateway.store.schema import upgrade_all

CHUNK = 5000  # audit rows per COPY
APPROVAL_TABLES = ("approval_requests", "approval_votes")  # parents first
# the file's other shared state (store/shared_keys.py, store/handoffs.py): a table missing in an older file is skipped
SHARED_TABLES = (
    "pvegate_keys",
    "request_state_uses",
    "request_handoffs",
    "console_signouts",
    "console_person_signouts",
)
LOCK_WAIT_S = 10.0  # for the SQLite write lock (a gateway's commit in progress)
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
    shared: dict[str, int] = field(default_factory=dict)  # SHARED_TABLES: rows moved


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return a.absolute() == b.absolute()


def _keys(source_key: Path, target_key: Path) -> HeadKey:
    """The source's key, after checking that the configuration's key, if it exists already, is the same."""
    src = HeadKey.load(source_key)
    if target_key.exists() and not _same_file(source_key, target_key):
        dst = HeadKey.load(target_key)
        if dst.key_id != src.key_id:
            raise MigrateError(
                f"the configuration's audit head key {target_key} (key id {dst.key_id}) is not the key the SQLite "
                f"audit was sealed with ({source_key}, key id {src.key_id}): point audit.head_key_file at that key, "
                "or remove the other file"
            )
    return src


def _copy_key(source_key: Path, target_key: Path) -> Path | None:
    """The source key at the configuration's place, when nothing is there yet (never replacing a file)."""
    if target_key.exists():
        return None
    target_key.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, source_key.read_bytes())
        os.fsync(fd)
    finally:
        os.close(fd)
    HeadKey.load(target_key)
    return target_key


def _db_id(source: Path, key: HeadKey) -> str:
    con = auditlib.connect(source, readonly=True)
    try:
        meta = {str(k): str(v) for k, v in con.execute("SELECT key, value FROM audit_meta")}
    finally:
        con.close()
    return auditlib.check_created(key, meta)


def _check_mark(where: Path, key: HeadKey, db_id: str, head: int) -> None:
    """Refuse a chain whose head is below the high-water mark kept next to a copy of its key."""
    try:
        mark = read_mark(where, key)
    except MarkError as exc:
        raise MigrateError(f"{exc}: nothing was moved") from None
    if mark is not None and mark["db"] == db_id and int(mark["seq"]) > head:
        raise MigrateError(
            f"the SQLite audit does not verify, nothing was moved: records at the end are missing: the head is at "
            f"seq {head} but seq {mark['seq']} was reached (high-water mark at {where}): an older head was put "
            "back, or an older copy of the database restored"
        )


def _lock_source(path: Path) -> sqlite3.Connection | None:
    """The SQLite file's write lock (BEGIN IMMEDIATE), held until the move is committed; None when this
    process cannot write the file (then only the head check after the move sees a writer)."""
    con = sqlite3.connect(
        path.absolute().as_uri(), uri=True, isolation_level=None, timeout=LOCK_WAIT_S, check_same_thread=False
    )
    try:
        con.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        con.close()
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise MigrateError(
                f"the SQLite audit {path} is being written (a gateway still runs on it): stop it, then run again"
            ) from None
        if "readonly" in text or "read-only" in text or "unable to open" in text:
            return None
        raise
    except BaseException:
        con.close()
        raise
    return con


def _unlock(con: sqlite3.Connection | None) -> None:
    if con is None:
        return
    try:
        if con.in_transaction:
            con.execute("ROLLBACK")
    finally:
        con.close()


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
    for table in SHARED_TABLES:
        n = await conn.fetchval(f"SELECT count(*) FROM {table}")  # noqa: S608 - fixed table names
        if n:
            found.append(f"{n} rows in {table}")
    return found


def describe(exc: BaseException, local: bool = False) -> str | None:
    """An error of the move as one sentence (None: a bug, let it be seen); `local`: an OSError is about a
    file here (the SQLite database, a key), never PostgreSQL's connection."""
    if isinstance(exc, MigrateError | DatabaseUnavailable | AuditKeyError | SchemaError):
        return str(exc)
    if isinstance(exc, sqlite3.Error):
        return f"the SQLite file: {exc}"
    if isinstance(exc, OSError) and (local or exc.filename):
        return f"{str(exc.filename) + ': ' if exc.filename else ''}{exc.strerror or exc}"
    why = refusal(exc)
    if why is not None:
        return why
    import asyncpg

    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
        return f"PostgreSQL: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


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
    dst_key_path = config.audit_key_path
    key = await asyncio.to_thread(_keys, src_key_path, dst_key_path)
    lock = await asyncio.to_thread(_lock_source, source)
    try:
        # the source's own mark (next to the key it was sealed with) is read by verify
        checked = await asyncio.to_thread(auditlib.verify, source, archives or [], key=src_key_path)
        if not checked.ok:
            raise MigrateError(f"the SQLite audit does not verify, nothing was moved: {checked.problem}")
        db_id = await asyncio.to_thread(_db_id, source, key)
        head = checked.last_seq or 0
        if dst_key_path.exists() and not _same_file(src_key_path, dst_key_path):
            await asyncio.to_thread(_check_mark, mark_path(dst_key_path), key, db_id, head)
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
                for table in (
                    "approval_votes",
                    "approval_requests",
                    "audit",
                    "audit_meta",
                    "audit_replicas",
                    *SHARED_TABLES,
                ):
                    await conn.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
                result = await asyncio.to_thread(_read_source, source)
                await _copy(conn, result)
        finally:
            await db.close()
    finally:
        await asyncio.to_thread(_unlock, lock)
    copied_rows = len(result["audit"])

    # committed: from here on an error must not say that nothing was kept in PostgreSQL
    try:
        return await _after_commit(
            source, config, src_key_path, key, db_id, archives, checked, head_before, result, say
        )
    except Exception as exc:
        why = describe(exc, local=True)  # PostgreSQL is only read by verify now, which says its own problem
        if why is None:
            raise
        raise MigrateError(
            f"the move was committed to PostgreSQL ({copied_rows} audit records), but then: {why}"
        ) from exc


async def _after_commit(
    source: Path,
    config: Config,
    src_key_path: Path,
    key: HeadKey,
    db_id: str,
    archives: list[Path] | None,
    checked: auditlib.VerifyResult,
    head_before: str | None,
    result: dict[str, Any],
    say: Callable[[str], None],
) -> MigrateResult:
    target = audit_location(config)
    after = await asyncio.to_thread(auditlib.verify, target, archives or [], key=src_key_path)
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
    dst_key_path = config.audit_key_path
    copied = await asyncio.to_thread(_copy_key, src_key_path, dst_key_path)
    if copied is not None:
        say(f"copied the audit head key {src_key_path} to {copied} (key id {key.key_id}): give it to every replica")
    # the mark goes where the key is: a replica given this key (and this mark) refuses the chain cut below it
    marked = mark_path(dst_key_path)
    try:
        if await asyncio.to_thread(write_mark, marked, key, db_id, after.last_seq or 0, after.head_hash):
            say(f"high-water mark {marked}: record {after.last_seq or 0}")
    except OSError as exc:  # the move holds; the replicas write their own marks as they start
        say(
            f"warning: the high-water mark {marked} cannot be written ({exc.strerror or exc}): "
            f"copy {mark_path(src_key_path)} there"
        )
    return MigrateResult(
        len(result["audit"]),
        after.last_seq,
        after.head_hash,
        len(result.get("approval_requests", [])),
        len(result.get("approval_votes", [])),
        copied,
        {table: len(result.get(table) or []) for table in SHARED_TABLES},
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
        for table in (*APPROVAL_TABLES, *SHARED_TABLES):
            try:
                cur = con.execute(f"SELECT * FROM {table}")  # noqa: S608 - fixed table names
            except sqlite3.OperationalError:  # an installation that never opened that store
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
    for table in (*APPROVAL_TABLES, *SHARED_TABLES):
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
