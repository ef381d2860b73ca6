"""The audit log: an append-only, hash-chained record of every call, in SQLite (WAL).

Each record carries the hash of its predecessor and a hash over all of its own
columns, so an edited, deleted, inserted or reordered row breaks the chain and
`verify` names the first record where it breaks.

Writes go through one writer task per process that groups whatever is queued
into one transaction (group commit, synchronous=FULL): `append` returns only
once its records are durable, so a decision record is on disk before the
connector runs, while concurrent calls share one fsync. The writer reads the
chain's tail inside its write transaction, so other processes (the `pvegate
approvals` CLI) can append to the same chain safely.

Nothing secret is written: every record is scrubbed of the gateway's own secret
values (Proxmox tokens, signing secrets) and of per-call secrets the caller
names, on top of the argument redaction done before records are built.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import contextvars
import fcntl
import fnmatch
import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from gateway.core.config import Config, ConfigError, service_secret_refs
from gateway.core.redaction import REDACTED, redact_keys, redact_path
from gateway.core.text import cut, one_line
from gateway.store import migrations
from gateway.store.audit_seal import (
    AuditKeyError,
    HeadKey,
    MarkError,
    default_key_path,
    mark_path,
    mark_text,
    read_mark,
    write_mark,
)
from gateway.store.db import (
    IDLE_IN_TRANSACTION_SECONDS,
    REPLICA_SETTINGS,
    Database,
    create_private,
    quote_ident,
    refusal,
    release_committed,
    wal_mode,
)
from gateway.store.pgsync import PgConnection, PgLocation
from gateway.store.settling import OPEN_CALLS_SQL
from gateway.tools.tool import Tool

log = logging.getLogger("pvegate.audit")

GENESIS = "0" * 64
MIN_SCRUB_LEN = 6  # shorter strings would scrub ordinary words

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq        INTEGER PRIMARY KEY,
    ts         REAL    NOT NULL,
    request_id TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    principal  TEXT,
    tool       TEXT,
    target     TEXT,
    outcome    TEXT,
    body       TEXT    NOT NULL,
    prev_hash  TEXT    NOT NULL,
    hash       TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_request ON audit(request_id);
CREATE INDEX IF NOT EXISTS audit_principal ON audit(principal, ts);
CREATE INDEX IF NOT EXISTS audit_ts ON audit(ts);
CREATE TABLE IF NOT EXISTS audit_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# Versioned schema (store/migrations.py, component "audit"). SQLite's version 1 is SCHEMA itself (a
# database from before versioning has exactly it). PostgreSQL's also makes audit_replicas (who runs
# which call, for reconciliation) and marks the new, empty chain `fresh`: only such a chain may be
# sealed under an existing key (an emptied one must not be re-sealed, as with SQLite's new file).
# SQL alone cannot sign, so the migration's mark is FRESH_UNSIGNED; `pvegate db upgrade` then signs it
# with the head key (sign_fresh), and only a signed mark is honoured: whoever can write to the
# database, but holds no key, cannot empty the audit and mark it new to have it sealed again.
MIGRATIONS: dict[str, Sequence[str]] = {
    "sqlite": [SCHEMA],
    "postgresql": [
        """
CREATE TABLE audit (
    seq        BIGINT PRIMARY KEY,
    ts         DOUBLE PRECISION NOT NULL,
    request_id TEXT NOT NULL,
    kind       TEXT NOT NULL,
    principal  TEXT,
    tool       TEXT,
    target     TEXT,
    outcome    TEXT,
    body       TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_request ON audit(request_id);
CREATE INDEX audit_principal ON audit(principal, ts);
CREATE INDEX audit_ts ON audit(ts);
CREATE TABLE audit_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO audit_meta (key, value) VALUES ('fresh', 'true');
CREATE TABLE audit_replicas (
    replica    TEXT PRIMARY KEY,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    seen_at    DOUBLE PRECISION NOT NULL
)
"""
    ],
}

COLUMNS = ("seq", "ts", "request_id", "kind", "principal", "tool", "target", "outcome", "body", "prev_hash", "hash")


def record_hash(
    prev: str,
    seq: int,
    ts: float,
    request_id: str,
    kind: str,
    principal: str | None,
    tool: str | None,
    target: str | None,
    outcome: str | None,
    body: str,
) -> str:
    """SHA-256 over every column but the hash itself, as canonical JSON."""
    doc = [prev, seq, ts, request_id, kind, principal, tool, target, outcome, body]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def row_hash(row: dict[str, Any]) -> str:
    return record_hash(
        row["prev_hash"],
        row["seq"],
        row["ts"],
        row["request_id"],
        row["kind"],
        row["principal"],
        row["tool"],
        row["target"],
        row["outcome"],
        row["body"],
    )


@dataclass(frozen=True)
class AuditRecord:
    request_id: str
    kind: str  # received | decision | result | auth_failure | refusal | approval
    principal: str | None = None
    tool: str | None = None
    target: str | None = None
    outcome: str | None = None
    body: dict[str, Any] | None = None
    scrub: tuple[str, ...] = field(default=(), compare=False)  # per-call secret values, never written
    # the policy input of a decision, kept so it can be replayed (`pvegate policy replay`): stored
    # compressed in the body under INPUT_FIELD, scrubbed of secrets first (the scrubber cannot see
    # into compressed text), so the chain's hash covers it like any other field
    policy_input: dict[str, Any] | None = field(default=None, compare=False)


class Scrubber:
    """Replaces known secret values in a record: as data, inside its strings, never in its JSON text.

    The gateway's own secrets (Proxmox tokens, signing secrets) and a call's secret values (a
    client's sensitive arguments, a secret Proxmox returned) are replaced inside the string values
    (and keys) of a body or policy input before it is serialised, and a number is replaced only when
    it is the secret itself: whatever a secret is chosen to be (a piece of JSON such as
    '{"error":'), the record stays the JSON it was. `__call__` scrubs a plain text (a column) of the
    gateway's own secrets; a call's secret values never rewrite a column (_prepare)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._needles: list[str] = []
        for s in secrets:
            self.add(s)

    def add(self, secret: str) -> None:
        for form in _forms(secret):
            if form not in self._needles:
                self._needles.append(form)
        self._needles.sort(key=len, reverse=True)  # longest first: a token before its suffix

    def needles(self, extra: Iterable[str] = ()) -> list[str]:
        """Every form of the gateway's secrets and of `extra`, longest first."""
        more = {f for s in extra for f in _forms(s)}
        if not more:
            return self._needles
        return sorted(more | set(self._needles), key=len, reverse=True)

    def __call__(self, text: str | None) -> str | None:
        """A plain text (not JSON) with the gateway's own secrets replaced."""
        return None if text is None else _replace(text, self._needles)

    def json_text(self, doc: dict[str, Any] | None, needles: Sequence[str]) -> str:
        """dumps_body(doc), with the needles replaced inside its strings (keys and values) and any number
        that is a needle replaced whole: always the JSON of a document. Serialised once and searched
        first; walked as data only when a needle turns up in the text."""
        text = dumps_body(doc)
        if not any(n in text for n in needles):
            return text
        return dumps_body(_scrub_data(json.loads(text), needles))


def _replace(text: str, needles: Sequence[str]) -> str:
    for n in needles:
        if n in text:
            text = text.replace(n, REDACTED)
    return text


def _scrub_data(doc: Any, needles: Sequence[str]) -> Any:
    """The JSON document with every needle replaced inside its strings; a number equal to a needle replaced."""
    if isinstance(doc, str):
        return _replace(doc, needles)
    if isinstance(doc, dict):
        return {_replace(k, needles): _scrub_data(v, needles) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_scrub_data(v, needles) for v in doc]
    if isinstance(doc, int | float) and not isinstance(doc, bool) and str(doc) in needles:
        return REDACTED
    return doc


def _forms(secret: str) -> list[str]:
    """The secret as written raw and as it appears inside JSON strings."""
    secret = str(secret).strip()
    if len(secret) < MIN_SCRUB_LEN:
        return []
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    return [f for f in forms if len(f) >= MIN_SCRUB_LEN]


def dumps_body(body: dict[str, Any] | None) -> str:
    return json.dumps(body or {}, sort_keys=True, separators=(",", ":"), default=str)


# A decision record's complete policy input: canonical JSON, zlib, base64. Compressed because
# it is the largest part of a decision record (~1.3 KB of JSON, ~0.9 KB packed; docs/audit.md).
INPUT_FIELD = "input_z"


# A 4 KiB window and a small memory level: an input is ~1 KB, so the output is the same size as with
# zlib's defaults, and compression takes 8 µs instead of 46-55 (the defaults allocate and clear
# ~256 KiB of state per call). Any zlib stream decompresses with the defaults, old records' included.
_WBITS, _MEMLEVEL = 12, 4


def pack_input(text: str) -> str:
    z = zlib.compressobj(6, zlib.DEFLATED, _WBITS, _MEMLEVEL)
    return base64.b64encode(z.compress(text.encode("utf-8")) + z.flush()).decode("ascii")


def unpack_input(body: dict[str, Any]) -> dict[str, Any] | None:
    """The policy input a decision record keeps, or None (an older record, or garbled)."""
    packed = body.get(INPUT_FIELD)
    if not isinstance(packed, str):
        return None
    try:
        doc = json.loads(zlib.decompress(base64.b64decode(packed, validate=True)))
    except (ValueError, zlib.error):
        return None
    return doc if isinstance(doc, dict) else None


def redacted_paths(original: Any, redacted: Any, prefix: str = "arguments") -> list[str]:
    """Dot paths where the redacted arguments differ from the originals (what a replay cannot see)."""
    if original == redacted:
        return []
    if isinstance(original, dict) and isinstance(redacted, dict):
        return [p for k in original if k in redacted for p in redacted_paths(original[k], redacted[k], f"{prefix}.{k}")]
    if isinstance(original, list) and isinstance(redacted, list) and len(original) == len(redacted):
        return [
            p
            for i, (a, b) in enumerate(zip(original, redacted, strict=True))
            for p in redacted_paths(a, b, f"{prefix}.{i}")
        ]
    return [prefix]


# Secret values of the call being handled (sensitive argument values): every record
# appended from this call's task is scrubbed of them, whatever field they turn up in
# (an argument error message, a Proxmox error echoing a parameter).
CALL_SECRETS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("call_secrets", default=())


def secret_values(sensitive: Iterable[str], arguments: Any) -> tuple[str, ...]:
    """String forms of every value under a sensitive key, at any depth of the raw arguments."""
    names = set(sensitive)
    out: list[str] = []

    def walk(doc: Any, hot: bool) -> None:
        if isinstance(doc, dict):
            for k, v in doc.items():
                walk(v, hot or k in names)
        elif isinstance(doc, list):
            for v in doc:
                walk(v, hot)
        elif hot and doc is not None and not isinstance(doc, bool):
            out.append(str(doc))

    if names:
        walk(arguments, False)
    return tuple(out)


def redact_arguments(sensitive: Iterable[str], arguments: dict[str, Any], paths: Iterable[str] = ()) -> dict[str, Any]:
    """The arguments as the audit may keep them: sensitive keys (any depth) and the policy's
    redact paths (relative to the arguments, or prefixed `arguments.`) replaced."""
    out: dict[str, Any] = redact_keys(arguments, frozenset(sensitive))  # new containers: paths may change them
    for path in paths:
        parts = path.split(".")
        redact_path(out, parts[1:] if parts[0] == "arguments" else parts)
    return out


class AuditClosed(Exception):
    """The audit log is closed; nothing more can be recorded (callers fail closed)."""


# (request_id, kind, principal, tool, target, outcome, body): a record as stored, before seq and hashes
_Row = tuple[str, str, str | None, str | None, str | None, str | None, str]


@dataclass(frozen=True)
class _IfAbsent:
    """A row written only if the chain holds no record of its request and kind with one of `outcomes` (by its
    principal, when `same_principal`): checked under the chain's append lock, so of two writers of one record
    (a transition's own writer, another replica's catch-up) one writes it."""

    row: _Row
    outcomes: tuple[str, ...]
    same_principal: bool

    def matches(self, row: _Row) -> bool:
        mine = self.row
        return row[:2] == mine[:2] and row[5] in self.outcomes and (not self.same_principal or row[2] == mine[2])

    def exists_sql(self) -> tuple[str, list[Any]]:
        sql = "SELECT 1 FROM audit WHERE request_id = ? AND kind = ? AND outcome IN ("
        sql += ", ".join("?" for _ in self.outcomes) + ")"
        args: list[Any] = [self.row[0], self.row[1], *self.outcomes]
        if self.same_principal:
            sql += " AND principal = ?"
            args.append(self.row[2])
        return sql + " LIMIT 1", args


_Entry = _Row | _IfAbsent
_Batch = tuple[tuple[_Entry, ...], "asyncio.Future[None]"]


def utf8_safe(text: str) -> str:
    """The text as both backends can store it (UTF-8, no NUL: PostgreSQL's text cannot hold one). A
    lone surrogate (a client's JSON escape such as "\\ud800") or a NUL is kept as its literal backslash
    escape, so the record is still written and chained."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _store_failure(exc: BaseException) -> bool:
    """An error of the store itself (locked, I/O, full, no authenticated head), not of the records written."""
    return isinstance(exc, sqlite3.OperationalError | AuditClosed | AuditIntegrityError | AuditStoreError)


def _settle(batch: list[_Batch], exc: BaseException | None) -> None:
    for _, fut in batch:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


class AuditStoreError(Exception):
    """The database behind the audit cannot be reached or refuses writes (PostgreSQL down, restarting,
    out of connections, read-only, out of disk, the chain's head held by another replica): a failure of
    the store, never of the records written."""


def _pg_record_fault(exc: BaseException) -> bool:
    """PostgreSQL refused what was sent (a value it cannot take), not the store being unwell: only that
    caller fails. Anything else from the driver (a cut connection, a server shutting down, a protocol
    state the driver cannot recover from) is the store's: every caller is refused until a commit works.
    A record number already taken is not the caller's either: the writer numbers records from the
    authenticated head, so a taken one is a row added past it by another hand (_seq_taken)."""
    import asyncpg

    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        return state[:2] == "22" or (state[:2] == "23" and state != "23505")  # data exception, integrity
    return isinstance(exc, UnicodeError)


def _pg_store_problem(exc: BaseException) -> str:
    """What AuditStoreError says of a PostgreSQL failure: why the database did not take the commit."""
    return refusal(exc) or f"PostgreSQL: {type(exc).__name__}: {exc}"


def _seq_taken(head: int, seq: int) -> AuditIntegrityError:
    return AuditIntegrityError(
        f"record {seq} exists past the authenticated head (record {head}): it was added outside the gateway; "
        "the chain is not extended until it is removed (`pvegate audit verify` names it)",
        seq,
    )


# PostgreSQL: all rows of a group commit in one statement (one array per column), continuing from the head
# record $12; it inserts none while a row exists past that head (added by another hand: _pg_past_head names it)
_PG_INSERT = (
    "INSERT INTO audit (seq, ts, request_id, kind, principal, tool, target, outcome, body, prev_hash, hash) "
    "SELECT * FROM unnest($1::bigint[], $2::float8[], $3::text[], $4::text[], $5::text[], $6::text[], "
    "$7::text[], $8::text[], $9::text[], $10::text[], $11::text[]) "
    "WHERE NOT EXISTS (SELECT 1 FROM audit WHERE seq > $12::bigint)"
)


def _present_dropped(entries: list[_Entry], exists: Callable[[str, list[Any]], bool]) -> list[_Row]:
    """The rows to write: each _IfAbsent whose record the chain (`exists`, under the append lock) or an earlier
    row of this commit already holds is dropped."""
    rows: list[_Row] = []
    for entry in entries:
        if isinstance(entry, _IfAbsent):
            if any(entry.matches(r) for r in rows) or exists(*entry.exists_sql()):
                continue
            entry = entry.row
        rows.append(entry)
    return rows


def _pg_placeholders(sql: str) -> str:
    """`?` placeholders as PostgreSQL's $1, $2, ..."""
    n = iter(range(1, sql.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(n)}", sql)


async def _pg_past_head(conn: Any, head: int) -> None:
    """Raise the integrity error of a row past the authenticated head (record `head`), if there is one."""
    past = await conn.fetchval("SELECT min(seq) FROM audit WHERE seq > $1::bigint", head)
    if past is not None:
        raise _seq_taken(head, int(past))


ACQUIRE_TIMEOUT = 10.0  # seconds a commit waits for a connection (PostgreSQL unreachable: refused after this)
# seconds a commit waits for the chain's head row (lock_timeout on the audit's sessions): a replica paused or cut
# off while it holds it costs the others a refusal after this, and PostgreSQL ends its transaction once it has
# been idle db.IDLE_IN_TRANSACTION_SECONDS, so the chain moves on
HEAD_LOCK_SECONDS = 5
HEARTBEAT_SECONDS = 5.0  # a replica's row in audit_replicas is refreshed at most this often (on commits)
# a replica whose row was not refreshed for this long is gone: its calls in flight are reconciled by others
REPLICA_STALE_SECONDS = 30.0
# the high-water mark is written at most this often while the chain grows (and at open and close): a cut
# of the chain's end is seen when it reaches below the last mark written, so within this many seconds of
# records (or the records of a crash's last interval) a cut is seen only against checkpoints
MARK_SECONDS = 1.0
# A heartbeat renews a replica's row only while it is younger than this (by the database's clock):
# two heartbeats' margin before the others may take the row for a gone replica's, and a renewal that
# is slow to commit still lands before that. An older row is given up, never revived (AuditLog.hold).
LEASE_SECONDS = REPLICA_STALE_SECONDS - 2 * HEARTBEAT_SECONDS
_PG_BEAT = (
    "UPDATE audit_replicas SET seen_at = extract(epoch FROM clock_timestamp())::float8 "
    "WHERE replica = $1 AND seen_at > extract(epoch FROM clock_timestamp())::float8 - $2 RETURNING 1"
)
_PG_REGISTER = (
    "INSERT INTO audit_replicas (replica, host, pid, started_at, seen_at) "
    "VALUES ($1, $2, $3, extract(epoch FROM clock_timestamp())::float8, "
    "extract(epoch FROM clock_timestamp())::float8)"
)


class LeaseLost(Exception):
    """This process no longer holds the replica name a call was decided under (PostgreSQL): its
    heartbeat went stale, so the other replicas may settle that call as a gone replica's."""

    def __init__(self, replica: str | None) -> None:
        super().__init__(
            f"this replica went more than {LEASE_SECONDS:.0f} s without a heartbeat in the shared audit "
            f"(its process or VM was paused, or it was cut off from the database), so the other replicas "
            f"may settle the calls it decided as {replica}: this one is not sent"
        )
        self.replica = replica


def replica_name() -> str:
    """This process's identity in the shared audit (host, pid, and a random part: pids are reused)."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class AuditLog:
    """Append-only audit log; one writer task per process, group commits.

    On SQLite the writer's connection lives in one thread of its own and a whole commit (read
    the head, insert, move the head, COMMIT) is one trip to it. On PostgreSQL (`path` is a
    PgLocation) a commit is one transaction on a pooled connection that first locks the chain's
    head row (SELECT ... FOR UPDATE): replicas append one after the other to one chain.
    """

    def __init__(
        self,
        path: Path | PgLocation,
        *,
        secrets: Iterable[str] = (),
        synchronous: str = "FULL",
        max_batch: int = 512,
        head_key: Path | None = None,
    ) -> None:
        self.path = path
        self.pg = isinstance(path, PgLocation)
        if head_key is None and isinstance(path, PgLocation):
            raise ValueError("an audit log on PostgreSQL needs the audit head key file (audit.head_key_file)")
        self.key_path = head_key or default_key_path(path)  # type: ignore[arg-type]
        # where free space is checked (the SQLite file's folder); None on PostgreSQL (the server's concern)
        self.local_dir: Path | None = None if isinstance(path, PgLocation) else path.parent
        # SQLite: (st_dev, st_ino) of the file this process opened (file_problem)
        self.file_id: tuple[int, int] | None = None
        # PostgreSQL: this process's name in audit_replicas and on its decision records (reconciliation's owner)
        self.replica_id: str | None = replica_name() if self.pg else None
        self._seal: Seal | None = None
        self._head: tuple[str, int, str] | None = None  # (stored text, seq, hash) of the head last checked
        # the furthest head this process has seen, (seq, hash): a head only moves forward, and only along the
        # chain this process saw (the record it names is still there when another process moved the head on)
        self._reached: tuple[int, str | None] = (0, None)
        # the high-water mark (next to the key): the furthest head a writer on this host reached, kept
        # outside the database so a start or a verify sees an older head put back (written every
        # MARK_SECONDS at most while the chain grows, and at close: never one fsync per call)
        self.mark_path = mark_path(self.key_path)
        self._marked = -1  # the seq this process last found or wrote in the mark
        self._mark_failing = False  # the last write failed (logged once until one works)
        self._marker: asyncio.Task[None] | None = None
        self.scrub = Scrubber(secrets)
        self.synchronous = synchronous
        self.max_batch = max_batch
        self._con: sqlite3.Connection | None = None  # SQLite: used only in self._thread
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._pgdb: Any = None  # PostgreSQL: a PostgresDatabase (its asyncpg pool)
        self._beat_at = 0.0
        self._lost_name: str | None = None  # a commit's heartbeat found this name's row too old: rename it
        self._naming = asyncio.Lock()  # one renaming at a time
        self.leases_lost = 0  # names given up (for metrics)
        self._beater: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[_Batch | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self.commits = 0  # transactions committed (for tests and metrics)
        self.records = 0
        self.counts: dict[tuple[str, str], int] = {}  # (kind, outcome) -> records written by this process
        # for readiness and metrics: the writer's last verdict on the store
        self.write_failures = 0  # transactions that failed
        self.last_commit_at: float | None = None  # monotonic time of the last successful commit
        self.last_error: str | None = None  # why the last commit failed; None once one succeeds

    @property
    def _high(self) -> int:
        return self._reached[0]

    async def open(self) -> None:
        # the mark is read before the head: a writer elsewhere on the chain may move both meanwhile, and a
        # mark read later than the head could name a record the head read earlier does not reach yet
        mark: dict[str, Any] | MarkError | None
        try:
            key = await asyncio.to_thread(HeadKey.load, self.key_path) if self.key_path.exists() else None
            mark = None if key is None else await asyncio.to_thread(read_mark, self.mark_path, key)
        except MarkError as exc:
            mark = exc
        except AuditKeyError:  # said by the opening below
            mark = None
        if isinstance(self.path, PgLocation):
            await self._open_pg(self.path)
        else:
            await self._open_sqlite(self.path)
        assert self._seal is not None
        try:
            found = None  # the hash of the record the mark names, as the chain has it now (None: not there)
            if isinstance(mark, dict) and mark["db"] == self._seal.db_id and isinstance(mark.get("hash"), str):
                got = await self._read("SELECT hash FROM audit WHERE seq = ?", mark["seq"])
                found = str(got[0][0]) if got else None
            await asyncio.to_thread(self._start_mark, mark, found)
        except BaseException:
            await self._close_store()
            raise
        for note in self._seal.notes:
            log.warning("audit: %s", note)
        self._writer = asyncio.create_task(self._write_loop(), name="audit-writer")
        self._marker = asyncio.create_task(self._mark_loop(), name="audit-high-water")
        if self._pgdb is not None:
            self._beater = asyncio.create_task(self._beat_loop(), name="audit-heartbeat")

    def _start_mark(self, mark: dict[str, Any] | MarkError | None, found: str | None = None) -> None:
        """At every start: log where the chain's head is, and refuse a head below the high-water mark (the
        end of the chain cut and an older authenticated head put back, from the WAL or an older copy), or a
        chain whose record at the mark is not the one marked (cut, then grown again from the older head)."""
        seal = self._seal
        assert seal is not None and seal.head is not None
        seq, ts = seal.head
        if seq >= self._high:
            self._reached = (seq, seal.head_hash)
        where = self.mark_path
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if 0 <= ts < 1e11 else "at an unknown time"
        move = (
            f"keep the database and {where} as evidence, check them with `pvegate audit verify` and your "
            f"off-host checkpoints; to go on from this head anyway, move {where} aside (the next start begins "
            f"a new mark at record {seq})"
        )
        if isinstance(mark, MarkError):
            raise AuditIntegrityError(f"{mark}: {move}")
        if mark is not None and mark["db"] != seal.db_id and not seal.new_chain:
            # Another database sealed with this key (two audit files beside one key, a `--db` of a copy, a
            # replay sample) wrote it last: one mark per key, so it follows whichever chain opens. Not a
            # refusal: that would stop a database for having a neighbour. Its cut end is then seen only
            # against checkpoints, as without a mark (docs/audit.md).
            log.error(
                "audit: the high-water mark %s was written for another audit database (id %s; this one is %s): "
                "it now follows this chain, from record %d; keep one audit database per head key",
                where,
                mark["db"],
                seal.db_id,
                seq,
            )
        if mark is not None and mark["db"] == seal.db_id and mark["seq"] > seq:
            raise AuditIntegrityError(
                f"records at the end are missing: the head is at seq {seq} but seq {mark['seq']} was reached "
                f"(high-water mark at {where}): an older head was put back, or an older copy of the database "
                f"restored; {move}",
                seq + 1,
            )
        if mark is not None and mark["db"] == seal.db_id and found is not None and found != mark.get("hash"):
            raise AuditIntegrityError(f"{_forked(int(mark['seq']), where)}; {move}", int(mark["seq"]))
        log.info(
            "audit: the chain head is record %d, written %s (database %s); high-water mark %s",
            seq,
            when,
            seal.db_id,
            f"record {mark['seq']} at {where}" if mark is not None and mark["db"] == seal.db_id else f"none at {where}",
        )
        if mark is None and not seal.new_chain:
            log.warning(
                "audit: there was no high-water mark at %s (the first start of a release that keeps one, or it was "
                "removed): it starts at record %d; a cut of the chain's end before now is seen only against "
                "off-host checkpoints",
                where,
                seq,
            )
        elif mark is not None and mark["db"] != seal.db_id and seal.new_chain:
            log.warning("audit: the high-water mark %s now follows the new chain (database %s)", where, seal.db_id)
        if mark is not None and mark["db"] == seal.db_id:
            self._marked = int(mark["seq"])
        self._write_mark()

    def _write_mark(self) -> None:
        """Write the furthest head seen to the high-water mark (in a worker thread: one small write and fsync)."""
        seal, (seq, digest) = self._seal, self._reached  # one read: the writer moves it meanwhile
        if seal is None or seq <= self._marked:
            return
        try:
            write_mark(self.mark_path, seal.key, seal.db_id, seq, digest)
        except OSError as exc:
            if not self._mark_failing:
                log.error(
                    "audit: the high-water mark %s cannot be written (%s): a cut of the chain's end is seen only "
                    "against off-host checkpoints; make it writable by the gateway's user (or create it there, "
                    "mode 0600, when its directory must stay read-only)",
                    self.mark_path,
                    exc.strerror or exc,
                )
            self._mark_failing = True
            return
        if self._mark_failing:
            log.warning("audit: the high-water mark %s is written again", self.mark_path)
        self._mark_failing = False
        self._marked = seq

    async def _mark_loop(self) -> None:
        while True:
            await asyncio.sleep(MARK_SECONDS)
            if self._high > self._marked:
                with contextlib.suppress(Exception):  # said by _write_mark; tried again next time
                    await asyncio.to_thread(self._write_mark)

    async def _close_store(self) -> None:
        """Close the store's connections, at a stop or after an opening that failed once it was open."""
        await self._close_sqlite()
        if self._pgdb is not None:
            db, self._pgdb = self._pgdb, None
            # gone on purpose: what it left open is for the other replicas to reconcile, now
            with contextlib.suppress(Exception):
                async with db.pool.acquire() as conn:
                    await conn.execute("UPDATE audit_replicas SET seen_at = 0 WHERE replica = $1", self.replica_id)
            await db.close()

    async def _open_sqlite(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Only a file this start creates may begin a chain under a key that already exists: an existing
        # file with no marker and no records was emptied (or truncated), and sealing it would launder that.
        new_file = not await asyncio.to_thread(path.exists)
        if new_file and self.key_path.exists():  # the key first, so a start that fails on it leaves no file
            await asyncio.to_thread(HeadKey.load, self.key_path)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="audit-sqlite")
        try:
            await self._in_thread(self._connect_sqlite, path)
            # once per process: check the sealed head, or seal a new/older database
            self._seal = await asyncio.to_thread(open_seal, path, self.key_path, new_file=new_file)
        except BaseException:
            await self._close_sqlite()
            raise

    def _connect_sqlite(self, path: Path) -> None:
        create_private(path)  # 0600 when this start makes it (its -wal and -shm take its mode)
        con = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        try:
            con.execute("PRAGMA busy_timeout=10000")
            wal_mode(con)
            con.execute(f"PRAGMA synchronous={self.synchronous}")
            migrations.upgrade_sync(con, "audit", MIGRATIONS["sqlite"])
            st = os.stat(path)
        except BaseException:
            con.close()
            raise
        self._con = con
        self.file_id = (st.st_dev, st.st_ino)

    def file_problem(self) -> str | None:
        """SQLite: why the file at audit.path is not the one this process writes, or None (one stat). Removed,
        renamed or replaced under a running gateway, the open connection keeps committing into the old inode:
        records no `audit verify` reads and the next start does not find, so nothing may be written there."""
        if self.file_id is None or isinstance(self.path, PgLocation):
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "the audit database file is gone from audit.path (removed or renamed)"
        except OSError as exc:
            return f"cannot check the audit database file ({exc.strerror or type(exc).__name__})"  # no path
        if (st.st_dev, st.st_ino) != self.file_id:
            return "the audit database file at audit.path is not the one this gateway writes"
        return None

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def _close_sqlite(self) -> None:
        if self._thread is None:
            return
        if self._con is not None:
            con, self._con = self._con, None
            with contextlib.suppress(Exception):
                await self._in_thread(con.close)
        thread, self._thread = self._thread, None
        await asyncio.to_thread(thread.shutdown, True)

    async def _open_pg(self, where: PgLocation) -> None:
        from gateway.store.db import PostgresDatabase

        # a transaction left idle (paused mid-commit) is ended by the server; the head row is waited for boundedly
        settings = {**REPLICA_SETTINGS, "lock_timeout": f"{HEAD_LOCK_SECONDS}s"}
        db = PostgresDatabase(where.url, where.password, max_size=4, settings=settings)
        await db.open()
        try:
            await migrations.check(db, "audit", MIGRATIONS)  # `pvegate db upgrade` makes it, not a replica
            self._seal = await asyncio.to_thread(open_seal_pg, where, self.key_path)
            async with db.pool.acquire() as conn:
                await conn.execute(_PG_REGISTER, self.replica_id, str(self.replica_id).split(":", 1)[0], os.getpid())
        except BaseException:
            await db.close()
            raise
        self._pgdb = db
        self._beat_at = time.monotonic()

    async def _beat_loop(self) -> None:
        """PostgreSQL: keep this replica's heartbeat fresh while nothing else commits (a long task waited on
        with no other traffic, a process without readiness probes, a writer waiting for the chain's head
        row), so nobody takes its calls for a dead replica's. On a connection of its own, not through the
        writer: another replica holding the head must not let this one's lease lapse. A failed beat is the
        store's problem, seen by the next call; the loop goes on."""
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            with contextlib.suppress(Exception):
                if time.monotonic() - self._beat_at >= HEARTBEAT_SECONDS:
                    async with asyncio.timeout(HEARTBEAT_SECONDS):
                        async with self._pgdb.pool.acquire() as conn:
                            await self._beat_on(conn)
            with contextlib.suppress(Exception):  # retried on the next beat if the database is away
                if self._lost_name is not None:
                    await self._rename(self._lost_name)

    async def close(self) -> None:
        if self._beater is not None:
            self._beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beater
            self._beater = None
        if self._writer is not None:
            await self._queue.put(None)  # drains what is queued, then stops
            await self._writer
            self._writer = None
        if self._marker is not None:
            self._marker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._marker
            self._marker = None
            await asyncio.to_thread(self._write_mark)  # a clean stop leaves the mark at the head
        await self._close_store()

    async def append(self, *records: AuditRecord) -> str | None:
        """Queue records (kept together, in order); returns once they are committed, with the replica
        name a decision or dispatch record among them was stamped with (PostgreSQL; None on SQLite)."""
        if self._writer is None or self._writer.done():
            raise AuditClosed("audit log is not open")
        extra = CALL_SECRETS.get()
        replica = self.replica_id
        # encoded here, in the caller's task: a record that cannot be encoded fails only its own call
        rows = tuple(self._prepare(r, extra, replica) for r in records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((rows, fut))
        await asyncio.shield(fut)  # a cancelled caller must not un-write a queued record
        return replica

    async def append_if_absent(self, record: AuditRecord, outcomes: Sequence[str], *, same_principal: bool) -> None:
        """Append `record` unless the chain already holds a record of its request_id and kind with an outcome in
        `outcomes` (and its principal, when `same_principal`), tested under the chain's append lock (SQLite: the
        writer's BEGIN IMMEDIATE; PostgreSQL: the head row, locked by every replica's commit). For a committed
        transition's record that a replica's catch-up may write too: whichever commits first writes it."""
        if self._writer is None or self._writer.done():
            raise AuditClosed("audit log is not open")
        row = _IfAbsent(self._prepare(record, CALL_SECRETS.get(), self.replica_id), tuple(outcomes), same_principal)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(((row,), fut))
        await asyncio.shield(fut)

    def _prepare(self, rec: AuditRecord, extra: tuple[str, ...], replica: str | None) -> _Row:
        """The record's stored columns: scrubbed of secrets, serialised, and storable as UTF-8.

        The body and the policy input are scrubbed as data (Scrubber.json_text), so no secret value
        can break their JSON. The principal, tool, target and outcome columns are scrubbed of the
        gateway's own secrets only: a call's secret values are chosen by the client, and must not
        rewrite whom or what its record names. A call secret a column states anyway (a password
        equal to the caller's own name) is no secret of that record: it is not scrubbed from it."""
        s = self.scrub
        cols = [c for c in (rec.principal, rec.tool, rec.target) if c]
        # equal to a column, not merely inside one: a secret that is part of the caller's name is still a secret
        call = tuple(x for x in rec.scrub + extra if str(x).strip() not in cols)
        needles = s.needles(call)

        def col(text: str | None) -> str | None:
            return None if text is None else utf8_safe(s(text) or "")

        body = rec.body
        if rec.policy_input is not None or (replica is not None and rec.kind in ("decision", "dispatch")):
            body = json.loads(s.json_text(body, needles))  # scrubbed first: the fields below are not
            if rec.policy_input is not None:  # packed after scrubbing: no needle may rewrite the packed text
                body[INPUT_FIELD] = pack_input(utf8_safe(s.json_text(rec.policy_input, needles)))
            if replica is not None and rec.kind in ("decision", "dispatch"):
                # who runs the call: reconciliation leaves a live replica's calls in flight alone
                body["replica"] = replica
            text = dumps_body(body)
        else:
            text = s.json_text(body, needles)
        return (
            utf8_safe(str(rec.request_id)),
            utf8_safe(str(rec.kind)),
            col(rec.principal),
            col(rec.tool),
            col(rec.target),
            col(rec.outcome),
            utf8_safe(text),
        )

    async def probe(self) -> None:
        """A readiness probe: one committed write through the writer (outside the hash chain). It fails
        as a commit of records would: on a row found past the authenticated head too (AuditIntegrityError),
        so readiness never turns green on an idle gateway that refuses every call."""
        await self.append()

    async def _write_loop(self) -> None:
        try:
            await self._write_batches()
        finally:  # however the writer ends, nobody waits forever for a record that will not be written
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None and not item[1].done():
                    item[1].set_exception(AuditClosed("audit writer stopped"))

    async def _write_batches(self) -> None:
        stop = False
        while not stop:
            item = await self._queue.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < self.max_batch and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            try:
                await self._commit([r for rows, _ in batch for r in rows])
            except Exception as exc:
                if len(batch) == 1 or _store_failure(exc):  # the store itself is unwell: everyone fails closed
                    _settle(batch, exc)
                else:  # one caller's records may be at fault: each caller alone, so the others still commit
                    await self._commit_each(batch)
                continue
            _settle(batch, None)

    async def _commit_each(self, batch: list[_Batch]) -> None:
        for n, (rows, fut) in enumerate(batch):
            try:
                await self._commit(list(rows))
            except Exception as exc:
                if _store_failure(exc):
                    _settle(batch[n:], exc)
                    return
                _settle([(rows, fut)], exc)
                continue
            _settle([(rows, fut)], None)

    async def _commit(self, entries: list[_Entry]) -> None:
        try:
            if self._pgdb is not None:
                try:
                    moved, records = await self._commit_pg(entries)
                except (AuditIntegrityError, AuditClosed, AuditStoreError):
                    raise
                except Exception as exc:
                    if _pg_record_fault(exc):
                        raise
                    raise AuditStoreError(_pg_store_problem(exc)) from exc
            else:
                moved, records = await self._in_thread(self._commit_sqlite, entries)
        except BaseException as exc:
            self._head = None  # whatever was read or written, check it afresh next time
            if isinstance(exc, Exception):  # for readiness and metrics
                self.write_failures += 1
                if _store_failure(exc):  # the store is unwell, not one caller's records
                    self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            raise
        if moved is not None:
            self._head = moved
            self._reached = (moved[1], moved[2])
        self.commits += bool(records)  # group commits of records (a probe is not one)
        self.records += len(records)
        self.last_commit_at = time.monotonic()
        self.last_error = None
        for rec in records:
            key = (rec[1], rec[5] or "")
            self.counts[key] = self.counts.get(key, 0) + 1

    def _chain(self, records: list[_Row], seq: int, prev: str) -> tuple[list[tuple[Any, ...]], str]:
        """The rows as stored (seq, ts, columns, prev_hash, hash), continuing from (seq, prev), and the new
        authenticated head naming the last of them."""
        seal = self._seal
        assert seal is not None
        rows = []
        for rec in records:
            seq += 1
            row = (seq, time.time(), *rec)
            digest = record_hash(prev, *row)
            rows.append((*row, prev, digest))
            prev = digest
        head = seal.key.signed_text("head", {"db": seal.db_id, "seq": seq, "hash": prev, "ts": time.time()})
        return rows, head

    def _commit_sqlite(self, entries: list[_Entry]) -> tuple[tuple[str, int, str] | None, list[_Row]]:
        """One whole commit, in the writer's thread: one trip from the event loop. Returns the new head and the
        rows written (an _IfAbsent whose record exists is not)."""
        con = self._con
        if con is None:
            raise AuditClosed("audit log is not open")
        con.execute("BEGIN IMMEDIATE")
        try:
            # the file removed or replaced under the gateway: a commit would go where no one reads it (one stat
            # per commit, in this thread; the records stay with their callers, refused, and readiness says why)
            if (gone := self.file_problem()) is not None:
                raise AuditStoreError(gone)
            high = self._high
            got = con.execute(
                "SELECT value, (SELECT hash FROM audit WHERE seq = ?) FROM audit_meta WHERE key = 'head'", (high,)
            ).fetchone()
            seq, prev = self._continue_from(None if got is None else str(got[0]), high, None if got is None else got[1])
            records = _present_dropped(entries, lambda sql, args: con.execute(sql, args).fetchone() is not None)
            # a row past the head (added by another hand, in a gap or not) refuses the commit, a probe's too:
            # readiness sees what every call meets (one lookup on the primary key, under the write lock)
            got = con.execute("SELECT min(seq) FROM audit WHERE seq > ?", (seq,)).fetchone()
            if got is not None and got[0] is not None:
                raise _seq_taken(seq, int(got[0]))
            moved = None
            if records:
                rows, head = self._chain(records, seq, prev)
                try:
                    con.executemany("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
                except sqlite3.IntegrityError as exc:
                    if "UNIQUE" not in str(exc) and "PRIMARY KEY" not in str(exc):
                        raise
                    # the seq is the only key: a row added past the head
                    got = con.execute("SELECT min(seq) FROM audit WHERE seq > ?", (seq,)).fetchone()
                    raise _seq_taken(seq, int(got[0]) if got and got[0] is not None else seq + 1) from exc
                # the authenticated head moves in the same transaction as the rows it names
                con.execute("UPDATE audit_meta SET value = ? WHERE key = 'head'", (head,))
                moved = (head, rows[-1][0], rows[-1][-1])
            else:  # a readiness probe (AuditLog.probe): a real committed write that leaves the chain alone
                con.execute(
                    "INSERT INTO audit_meta(key, value) VALUES ('probe', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (str(time.time()),),
                )
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                with contextlib.suppress(Exception):
                    con.execute("ROLLBACK")
            raise
        return moved, records

    async def _commit_pg(self, entries: list[_Entry]) -> tuple[tuple[str, int, str] | None, list[_Row]]:
        pool = self._pgdb.pool
        conn = await pool.acquire(timeout=ACQUIRE_TIMEOUT)
        try:
            if not entries or time.monotonic() - self._beat_at >= HEARTBEAT_SECONDS:
                # a probe writes the heartbeat (a real committed write that leaves the chain alone), a commit
                # when one is due: in a statement of its own, before the head row is waited for
                await self._beat_on(conn)
            moved, records = await self._commit_on(conn, entries)
        except BaseException as exc:
            # the error that ended the commit is the one to tell (a connection the server closed is already
            # back in the pool: terminating or releasing it again raises)
            with contextlib.suppress(Exception):
                if not _pg_record_fault(exc):  # a connection in doubt is never reused: the pool makes a new one
                    conn.terminate()
                await pool.release(conn)
            raise
        # committed: the records are in the chain, so a connection that fails after COMMIT fails nobody
        await release_committed(pool, conn)
        return moved, records

    async def _beat_on(self, conn: Any) -> None:
        """Renew this replica's heartbeat (autocommit); a row found too old marks the name lost."""
        name = self.replica_id
        held = await conn.fetchval(_PG_BEAT, name, LEASE_SECONDS) is not None
        self._beat_at = time.monotonic()
        if not held and name == self.replica_id:  # not renamed meanwhile: the beat loop renames it
            self._lost_name = name

    async def _commit_on(self, conn: Any, entries: list[_Entry]) -> tuple[tuple[str, int, str] | None, list[_Row]]:
        import asyncpg

        moved = None
        async with conn.transaction():
            # the head row is the chain's lock: every replica's commit waits here for the one before it, for
            # HEAD_LOCK_SECONDS at most (a holder paused mid-commit is ended by the server, its commit fails)
            high = self._high
            try:
                # with the hash of the record this process last saw at the head (one round trip): committed
                # before this statement began, so its snapshot has it
                got = await conn.fetchrow(
                    "SELECT value, (SELECT hash FROM audit WHERE seq = $1) FROM audit_meta WHERE key = 'head' "
                    "FOR UPDATE",
                    high,
                )
            except asyncpg.LockNotAvailableError as exc:
                raise AuditStoreError(
                    f"another replica holds the audit head: the chain's head row stayed locked for more than "
                    f"{HEAD_LOCK_SECONDS} s (a replica paused, or cut off, in the middle of a commit: PostgreSQL "
                    f"ends its transaction once it has been idle {IDLE_IN_TRANSACTION_SECONDS} s; or an operator's "
                    "`pvegate audit archive` or `checkpoint` still running)"
                ) from exc
            seq, prev = self._continue_from(None if got is None else got[0], high, None if got is None else got[1])
            records: list[_Row] = []
            for entry in entries:  # an _IfAbsent is tested here, under the head row's lock
                if isinstance(entry, _IfAbsent):
                    sql, args = entry.exists_sql()
                    if any(entry.matches(r) for r in records) or await conn.fetchval(_pg_placeholders(sql), *args):
                        continue
                    entry = entry.row
                records.append(entry)
            if records:
                rows, head = self._chain(records, seq, prev)
                try:
                    # inserts nothing while a row exists past the head (no round trip more on the hot path)
                    status = await conn.execute(_PG_INSERT, *[list(col) for col in zip(*rows, strict=True)], seq)
                except asyncpg.UniqueViolationError as exc:  # the seq is the only key: a row added past the head
                    taken = re.search(r"\(seq\)=\((\d+)\)", str(getattr(exc, "detail", "") or ""))
                    raise _seq_taken(seq, int(taken.group(1)) if taken else seq + 1) from exc
                if str(status).rsplit(" ", 1)[-1] != str(len(rows)):
                    await _pg_past_head(conn, seq)
                    raise AuditStoreError(f"PostgreSQL: the audit insert wrote {status!r}, not {len(rows)} rows")
                await conn.execute("UPDATE audit_meta SET value = $1 WHERE key = 'head'", head)
                moved = (head, rows[-1][0], rows[-1][-1])
            else:  # a readiness probe: a row past the head refuses it as it refuses every commit
                await _pg_past_head(conn, seq)
        return moved, records

    async def hold(self, replica: str | None) -> None:
        """Right before a mutation decided under `replica` is sent (PostgreSQL): renew this replica's
        heartbeat now, by the database's clock, or raise LeaseLost (and take a new name) when that
        name is no longer this process's or its row is too old to renew: the other replicas may then
        settle the call as a gone replica's. No local clock is trusted: a paused VM's stands still.
        SQLite (one host): nothing to hold. A database that cannot be asked raises its error."""
        if self._pgdb is None:
            return
        if replica != self.replica_id:
            raise LeaseLost(replica)
        try:  # bounded: a renewal answered late must not let a mutation leave late
            async with self._pgdb.pool.acquire(timeout=HEARTBEAT_SECONDS) as conn:
                held = await conn.fetchval(_PG_BEAT, replica, LEASE_SECONDS, timeout=HEARTBEAT_SECONDS) is not None
            if not held:
                await self._rename(str(replica))
        except Exception as exc:  # not confirmed is not sent: the store's failure, every caller's
            raise AuditStoreError(f"PostgreSQL: the heartbeat cannot be renewed: {type(exc).__name__}: {exc}") from exc
        if not held:
            raise LeaseLost(replica)

    async def _rename(self, old: str) -> None:
        """The row of `old` was too old to renew (or was forgotten): a new name for the calls to come.
        The old row stays, or comes back as gone, so the other replicas settle what was decided under
        it; this process settles the mutations it refuses (a refusal record) and finishes its reads."""
        async with self._naming:
            if self.replica_id != old:  # renamed meanwhile
                if self._lost_name == old:
                    self._lost_name = None
                return
            new, host = replica_name(), old.split(":", 1)[0]
            async with self._pgdb.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn, conn.transaction():
                await conn.execute(
                    "INSERT INTO audit_replicas (replica, host, pid, started_at, seen_at) "
                    "VALUES ($1, $2, $3, 0, 0) ON CONFLICT (replica) DO NOTHING",
                    old,
                    host,
                    os.getpid(),
                )
                await conn.execute(_PG_REGISTER, new, host, os.getpid())
            log.error(
                "replica %s went more than %.0f s without a heartbeat (paused, or cut off from the database): "
                "its calls are the other replicas' to settle, and the mutations it decided are not sent; "
                "it goes on as %s",
                old,
                LEASE_SECONDS,
                new,
            )
            self.replica_id, self._lost_name = new, None
            self.leases_lost += 1

    def _continue_from(self, text: str | None, high: int, at_high: Any) -> tuple[int, str]:
        """Where the chain continues: its authenticated head, read inside the write transaction
        (another process or replica may have appended). The writer continues only from there, so
        rows cut or added by another hand stay visible as a gap or a clash and are never
        re-authenticated; rows and head are compared in full at open and by verify. `at_high` is the
        hash the chain now has at record `high`, the furthest this process saw (None: not there, archived)."""
        seal = self._seal
        assert seal is not None
        cached = self._head
        if cached is not None and text == cached[0]:  # the head this process wrote or checked last
            return cached[1], cached[2]
        seq, digest = head_point(seal, text)
        if seq < self._high:  # authentic but old: continuing from it would re-authenticate the cut
            raise AuditIntegrityError(
                f"the chain head (audit_meta 'head') went back from record {self._high} to record {seq}: "
                "an older head was put back (records after it removed), outside the gateway",
                seq + 1,
            )
        # moved on by another process: along the chain this process saw, not a chain cut and grown again from
        # an older head (another replica continuing from it), which no record number alone tells apart
        reached_seq, reached_hash = self._reached
        now = digest if seq == reached_seq else (at_high if high == reached_seq else None)
        if reached_hash is not None and now is not None and now != reached_hash:
            raise AuditIntegrityError(
                f"record {reached_seq} is no longer the record this process saw there: the chain was cut and "
                "written again from an older head, outside the gateway",
                reached_seq,
            )
        self._head = (str(text), seq, digest)
        self._reached = (seq, digest)
        return seq, digest

    async def _read(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """A read on the writer's store (fully fetched: no read stays open across the writer's commits)."""
        if self._pgdb is not None:
            from gateway.store.db import pg_sql

            async with self._pgdb.pool.acquire() as conn:
                return [tuple(r) for r in await conn.fetch(pg_sql(sql), *args)]

        def read() -> list[tuple[Any, ...]]:
            if self._con is None:
                raise AuditClosed("audit log is not open")
            return [tuple(r) for r in self._con.execute(sql, args).fetchall()]

        result: list[tuple[Any, ...]] = await self._in_thread(read)
        return result

    async def rows(self, request_id: str | None = None) -> list[dict[str, Any]]:
        sql = f"SELECT {', '.join(COLUMNS)} FROM audit"  # noqa: S608 - fixed column names
        args: tuple[Any, ...] = ()
        if request_id:
            sql += " WHERE request_id = ?"
            args = (request_id,)
        out = []
        for r in await self._read(sql + " ORDER BY seq", *args):
            d = dict(zip(COLUMNS, r, strict=True))
            d["body"] = parse_body(d)
            out.append(d)
        return out

    async def console_sign_ins(self, since: float, sub: str | None = None) -> set[str]:
        """The subjects who signed in to the console since `since` (of `sub` only, when given, by the
        principal index): the people whose sessions may still be open (none outlives
        console.max_session_seconds)."""
        sql = "SELECT principal, body FROM audit WHERE ts >= ? AND kind = 'console' AND outcome = 'ok' AND "
        if sub is None:
            rows = await self._read(sql + "principal IS NOT NULL", since)
        else:
            rows = await self._read(sql + "principal = ?", since, sub)
        return {str(r[0]) for r in rows if _action(r[1]) == "sign_in"}

    async def allowed_since(self, since: float) -> list[tuple[float, str, str]]:
        """(ts, principal, tool) of calls allowed or held for approval since `since`: usage counters' memory."""
        sql = (
            "SELECT ts, principal, tool FROM audit WHERE ts >= ? AND kind = 'decision' "
            "AND outcome IN ('allow', 'pending') "
            "AND principal IS NOT NULL AND tool IS NOT NULL ORDER BY ts"
        )
        return [(float(r[0]), str(r[1]), str(r[2])) for r in await self._read(sql, since)]

    async def live_replicas(self) -> set[str] | None:
        """PostgreSQL: the replicas whose heartbeat is fresh (by the database's clock); None on SQLite."""
        if self._pgdb is None:
            return None
        rows = await self._read(
            "SELECT replica FROM audit_replicas WHERE seen_at > extract(epoch FROM clock_timestamp())::float8 - ?",
            REPLICA_STALE_SECONDS,
        )
        return {str(r[0]) for r in rows}

    async def stale_replicas(self) -> set[str]:
        """PostgreSQL: replicas whose heartbeat is older than REPLICA_STALE_SECONDS (gone); empty on SQLite."""
        if self._pgdb is None:
            return set()
        rows = await self._read(
            "SELECT replica FROM audit_replicas WHERE seen_at <= extract(epoch FROM clock_timestamp())::float8 - ?",
            REPLICA_STALE_SECONDS,
        )
        return {str(r[0]) for r in rows} - {str(self.replica_id)}

    async def claim_gone(self, replicas: set[str], turn: Turn | None = None) -> set[str]:
        """PostgreSQL: of these replicas (not live when looked at), the ones whose calls the caller may now
        settle. A row still stale (an old heartbeat, or marked gone by a clean stop or a rename: seen_at >= 0)
        is moved to claimed (seen_at = CLAIMED) by one conditional UPDATE, which waits for a heartbeat that
        renewed the row but has not committed yet and then sees it, so a renewal and a settlement never both
        win; the rows that statement moved are returned. A claimed row is never renewed again, and what its
        replica left open after a pass is the next pass's, on any replica: rows claimed earlier, and names
        with no row at all (forgotten: nothing can renew them either), are returned only to the holder of the
        reconcile lock (`turn`), checked by pg_locks in the same transaction, on the lock's own connection.
        So two claimants never both win: one of them does not hold the lock. A row locked for more than two
        seconds is left for the next pass. Raises TurnLost when the lock's connection fails."""
        if self._pgdb is None or not replicas:
            return set()
        import asyncpg

        from gateway.store.db import pg_sql

        names = sorted(replicas)

        async def claim(conn: Any, locked: bool) -> set[str]:
            async with conn.transaction():
                await conn.execute("SET LOCAL lock_timeout = '2s'")
                moved = await conn.fetch(
                    "UPDATE audit_replicas SET seen_at = $3 WHERE replica = ANY($1::text[]) AND seen_at >= 0 "
                    "AND seen_at <= extract(epoch FROM clock_timestamp())::float8 - $2 RETURNING replica",
                    names,
                    REPLICA_STALE_SECONDS,
                    CLAIMED,
                )
                out = {str(r[0]) for r in moved}
                if locked and turn is not None and await conn.fetchval(pg_sql(f"SELECT {_HELD}"), turn.name):
                    rows = await conn.fetch(
                        "SELECT replica, seen_at FROM audit_replicas WHERE replica = ANY($1::text[])", names
                    )
                    out |= {str(r[0]) for r in rows if r[1] < 0} | (replicas - {str(r[0]) for r in rows})
                return out

        try:
            if turn is not None and turn.conn is not None:
                try:
                    return await claim(turn.conn, turn.held)
                except asyncpg.LockNotAvailableError:
                    raise
                except Exception as exc:
                    turn.held = False
                    raise TurnLost(f"the {turn.name} lock's connection failed: {type(exc).__name__}: {exc}") from exc
            async with self._pgdb.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                return await claim(conn, False)
        except asyncpg.LockNotAvailableError:
            return set()

    async def forget_replicas(self, replicas: set[str]) -> None:
        if self._pgdb is None or not replicas:
            return
        async with self._pgdb.pool.acquire() as conn:
            await conn.execute(
                "DELETE FROM audit_replicas WHERE replica = ANY($1::text[]) "
                "AND seen_at <= extract(epoch FROM clock_timestamp())::float8 - $2",
                sorted(replicas),
                REPLICA_STALE_SECONDS,
            )

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[Turn]:
        """Whether this replica holds `name` for the block (a Turn, true while held; not waited for), so one
        replica at a time does a shared chore; SQLite (one host): always held. PostgreSQL: a session advisory
        lock on one pooled connection kept for the block. A cut connection frees that lock without telling
        this process, so whatever must not be done twice asks Turn.confirm first; a connection whose unlock
        fails is closed, never handed back to the pool still holding the lock."""
        if self._pgdb is None:
            yield Turn(self, name)
            return
        async with self._pgdb.pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
            got = bool(await conn.fetchval("SELECT pg_try_advisory_lock(hashtextextended($1, 0))", name))
            try:
                yield Turn(self, name, conn, got)
            finally:
                if got:
                    try:
                        await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", name, timeout=5)
                    except Exception:  # cut, or in doubt: closing the session frees the lock with it
                        with contextlib.suppress(Exception):  # (a connection found cut is gone from the pool)
                            conn.terminate()


CLAIMED = -1.0  # audit_replicas.seen_at of a gone replica another one claimed (AuditLog.claim_gone)
# whether this session (still) holds the advisory lock named ? (a bigint key: classid high, objid low)
_HELD = (
    "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() "
    "AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = hashtextextended(?, 0))"
)


class TurnLost(Exception):
    """A chore's lock (AuditLog.exclusive) is no longer this process's: its connection was cut (a network
    blip, a restart, pg_terminate_backend), so another replica may hold it now. The chore stops."""


class Turn:
    """AuditLog.exclusive's answer: true while this process holds the lock."""

    def __init__(self, log: AuditLog, name: str, conn: Any = None, held: bool = True) -> None:
        self.log = log
        self.name = name
        self.conn = conn  # PostgreSQL: the connection whose session holds the lock; None on SQLite
        self.held = held

    def __bool__(self) -> bool:
        return self.held

    async def confirm(self, sql: str | None = None, *args: Any) -> Any:
        """Raise TurnLost unless the lock is still this process's; else the first column of `sql`'s first
        row (`?` placeholders; None without a row), read in the same statement as that check (PostgreSQL:
        on the lock's own connection, which pg_locks must show still holding it). SQLite: only the read."""
        if not self.held:
            raise TurnLost(f"the {self.name} lock is not held")
        if self.conn is None:
            rows = [] if sql is None else await self.log._read(sql, *args)
            return rows[0][0] if rows else None
        from gateway.store.db import pg_sql

        query = pg_sql(f"SELECT {_HELD}, {'NULL' if sql is None else f'({sql})'}")
        try:
            row = await self.conn.fetchrow(query, self.name, *args, timeout=ACQUIRE_TIMEOUT)
        except Exception as exc:
            self.held = False
            raise TurnLost(f"the {self.name} lock's connection failed: {type(exc).__name__}: {exc}") from exc
        if row is None or not row[0]:
            self.held = False
            raise TurnLost(f"the {self.name} lock is no longer held by this process's session")
        return row[1]


def _action(body: Any) -> Any:
    """A console record's action; None for a body that is not a JSON object (never a reader's crash)."""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return None
    return doc.get("action") if isinstance(doc, dict) else None


# --- the seal: the chain's head authenticated with a key kept outside the database -------------


class AuditIntegrityError(Exception):
    """The authenticated head, creation marker or anchor does not hold (a sentence); nothing is written."""

    def __init__(self, problem: str, seq: int | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.seq = seq


@dataclass(frozen=True)
class Seal:
    """What a writer needs to extend a sealed chain: the key and the database's id."""

    key: HeadKey
    db_id: str
    notes: tuple[str, ...] = ()  # what opening did (key generated, an older database sealed), for the log
    head: tuple[int, float] | None = None  # the head opening found or wrote: (seq, time it was written)
    head_hash: str | None = None  # the hash of the record that head names
    new_chain: bool = False  # this opening began the chain (a new file, a fresh PostgreSQL chain)


def _doc(text: Any, what: str) -> dict[str, Any]:
    """A JSON object stored in audit_meta (or an archive), or a sentence naming what is garbled."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        raise AuditIntegrityError(f"the {what} is garbled (not a JSON object)")
    return doc


def _point(doc: dict[str, Any], what: str) -> tuple[int, str]:
    seq, digest = doc.get("seq"), doc.get("hash")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0 or not isinstance(digest, str):
        raise AuditIntegrityError(f"the {what} is garbled (no record number and hash)")
    return seq, digest


def _meta_all(con: Any) -> dict[str, str]:
    try:
        return {str(k): str(v) for k, v in con.execute("SELECT key, value FROM audit_meta")}
    except sqlite3.OperationalError as exc:
        # dropped: treated as empty, which no sealed database is
        if "no such table" in str(exc) or "does not exist" in str(exc):
            return {}
        raise


NO_MARKER = (
    "the database has no creation marker (audit_meta 'created'): its audit_meta was emptied or dropped, "
    "or it is from a release before keyed heads and no gateway has opened it since (starting one seals it)"
)


def check_created(key: HeadKey, meta: dict[str, str]) -> str:
    """The database's id, from its authenticated creation marker."""
    text = meta.get("created")
    if text is None:
        raise AuditIntegrityError(NO_MARKER)
    created = _doc(text, "creation marker (audit_meta 'created')")
    if not key.check("created", created) or not isinstance(created.get("db"), str):
        other = created.get("key_id")
        if isinstance(other, str) and other != key.key_id:
            raise AuditIntegrityError(
                f"the database was sealed with another audit head key (key id {other}); "
                f"{key.path} holds key id {key.key_id}"
            )
        raise AuditIntegrityError(
            "the creation marker (audit_meta 'created') is not authenticated by the audit head key: "
            "it was written or changed outside the gateway"
        )
    return str(created["db"])


def check_anchor(key: HeadKey, db_id: str, text: str | None) -> dict[str, Any] | None:
    """The authenticated archive anchor (where the database's records continue from), if any."""
    if text is None:
        return None
    anchor = _doc(text, "archive anchor (audit_meta 'anchor')")
    _point(anchor, "archive anchor (audit_meta 'anchor')")
    if not key.check("anchor", anchor) or anchor.get("db") != db_id:
        raise AuditIntegrityError(
            "the archive anchor (audit_meta 'anchor') is not authenticated by the audit head key: "
            "it was written or changed outside the gateway"
        )
    return anchor


def head_point(seal: Seal, head_text: str | None) -> tuple[int, str]:
    """The (seq, hash) the authenticated head names."""
    if head_text is None:
        raise AuditIntegrityError("the chain head (audit_meta 'head') is missing: it was deleted")
    head = _doc(head_text, "chain head (audit_meta 'head')")
    seq, digest = _point(head, "chain head (audit_meta 'head')")
    if not seal.key.check("head", head) or head.get("db") != seal.db_id:
        raise AuditIntegrityError(
            "the chain head (audit_meta 'head') is not authenticated by the audit head key: "
            "it was written or changed outside the gateway"
        )
    return seq, digest


def check_head(
    seal: Seal, head_text: str | None, last: tuple[int, str] | None, anchor_text: str | None
) -> tuple[int, str]:
    """The authenticated head (seq, hash), checked against the last record (with no records: the anchor)."""
    seq, digest = head_point(seal, head_text)
    if last is None:
        anchor = check_anchor(seal.key, seal.db_id, anchor_text)
        start = (0, GENESIS) if anchor is None else _point(anchor, "archive anchor")
        if (seq, digest) != start:
            raise AuditIntegrityError(
                f"record {start[0] + 1}..{seq} is missing (deleted): the authenticated head is record {seq} "
                f"but the database holds no record after {start[0]}",
                start[0] + 1,
            )
    elif last != (seq, digest):
        if last[0] < seq:
            raise AuditIntegrityError(
                f"record {last[0] + 1}..{seq} at the end is missing (deleted): the authenticated head is record {seq}",
                last[0] + 1,
            )
        if last[0] > seq:
            raise AuditIntegrityError(
                f"record {seq + 1}..{last[0]} was added after the authenticated head (record {seq}), "
                "outside the gateway",
                seq + 1,
            )
        raise AuditIntegrityError(f"record {seq} is not the record the authenticated head names: it was replaced", seq)
    return seq, digest


def _upsert(con: Any, key: str, value: Any) -> None:
    con.execute(
        "INSERT INTO audit_meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, json.dumps(value)),
    )


def open_seal(path: Path, key_path: Path, *, new_file: bool = False) -> Seal:
    """A writer's start: check a sealed database's head, or seal a new one or one from an older release.

    An older database (records but no creation marker) is sealed only after its whole chain
    verifies, and only with a key generated now: with a key that already exists, a missing
    marker more likely means audit_meta was removed to have a cut chain re-sealed. Likewise an
    empty database is sealed under an existing key only when this start created the file
    (`new_file`): one that was there, with neither records nor marker, was emptied.
    """
    con = sqlite3.connect(path, isolation_level=None, timeout=10.0)
    con.row_factory = sqlite3.Row
    try:
        con.execute("PRAGMA busy_timeout=10000")
        con.executescript(SCHEMA)
        con.execute("BEGIN IMMEDIATE")
        try:
            _refuse_foreign_triggers(con)
            seal = _open_seal(con, key_path, new_file)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return seal
    finally:
        con.close()


def _refuse_foreign_triggers(con: sqlite3.Connection) -> None:
    """A writer's start: no trigger pvegate does not make, as verify checks (_check_schema): one on the audit
    table could change every record as it is written, after its hash was computed, or write records of its own."""
    expected = _expected_schema()
    for kind, name, table in con.execute("SELECT type, name, tbl_name FROM sqlite_master WHERE type = 'trigger'"):
        shapes = expected.get((kind, name))
        if shapes is None or _object_shape(con, kind, name, table) not in shapes:
            raise AuditIntegrityError(
                f"the database holds a trigger {name!r} (on {table}) that pvegate does not make: it was added "
                "outside the gateway and can change what is written; run `pvegate audit verify`, then drop it "
                "(keep a copy of the file as evidence first)"
            )


FRESH_UNSIGNED = "true"  # the migration's mark of a new chain, before `pvegate db upgrade` signs it


async def sign_fresh(db: Database, key: HeadKey) -> bool:
    """PostgreSQL: sign the migration's mark of a new, empty chain with the head key (`pvegate db
    upgrade`, which holds the key); whether there was one to sign. A sealed chain has no mark."""
    doc = key.sign("fresh", {"key_id": key.key_id, "nonce": uuid.uuid4().hex, "ts": time.time()})
    async with db.transaction() as tx:
        changed = await tx.execute(
            "UPDATE audit_meta SET value = ? WHERE key = 'fresh' AND value = ?", json.dumps(doc), FRESH_UNSIGNED
        )
    return changed > 0


def _fresh(key: HeadKey, meta: dict[str, str]) -> bool:
    """Whether the chain is marked new by `pvegate db upgrade` with this key (an unsealed chain only)."""
    text = meta.get("fresh")
    if text is None or "created" in meta:
        return False
    with contextlib.suppress(ValueError, TypeError):
        if key.check("fresh", json.loads(text)):
            return True
    if text == FRESH_UNSIGNED:
        raise AuditIntegrityError(
            "the audit chain is marked new but the mark is not signed: run `pvegate db upgrade` (with the audit "
            "head key in place) once more to sign it, then start the replicas"
        )
    raise AuditIntegrityError(
        "the audit chain is marked new, but not with this audit head key: the audit was emptied and marked by "
        "hand, or `pvegate db upgrade` ran with another key (run `pvegate audit verify`, check your checkpoints)"
    )


def open_seal_pg(where: PgLocation, key_path: Path) -> Seal:
    """`open_seal` on PostgreSQL: the key must exist (every replica is given the same file; a key made
    here would be one replica's own), and only a `fresh` chain (its tables made by `pvegate db upgrade`,
    nothing written since) is sealed under it. Sealers take turns (BEGIN IMMEDIATE: an advisory lock)."""
    if not key_path.exists():
        raise AuditKeyError(
            f"the audit head key file {key_path} is missing: on PostgreSQL every replica needs the same key "
            "(`pvegate db upgrade` creates it once; copy it to every replica, mode 0600)"
        )
    con = PgConnection(where)
    try:
        problem = pg_objects_problem(con)  # what verify refuses, a replica does not write through
        if problem is not None:
            raise AuditIntegrityError(f"{problem}; run `pvegate audit verify`")
        con.execute("BEGIN IMMEDIATE")
        try:
            seal = _open_seal(con, key_path, _fresh(HeadKey.load(key_path), _meta_all(con)), create_key=False)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return seal
    finally:
        con.close()


def _open_seal(con: Any, key_path: Path, new_file: bool, *, create_key: bool = True) -> Seal:
    meta = _meta_all(con)
    row = con.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    last = None if row is None else (int(row[0]), str(row[1]))
    if "created" in meta:
        key = HeadKey.load(key_path)
        seal = Seal(key, check_created(key, meta))
        seq, digest = check_head(seal, meta.get("head"), last, meta.get("anchor"))
        when = _doc(meta["head"], "chain head").get("ts")
        at = float(when) if isinstance(when, int | float) else 0.0
        return Seal(key, seal.db_id, head=(seq, at), head_hash=digest)
    older = last is not None or "anchor" in meta
    key, made = HeadKey.load_or_create(key_path) if create_key else (HeadKey.load(key_path), False)
    notes = [f"generated a new audit head key at {key_path} (key id {key.key_id}): back it up"] if made else []
    if older and not made:
        raise AuditIntegrityError(
            f"the audit database has records but no creation marker, and the audit head key {key_path} already "
            "exists: audit_meta was removed (run `pvegate audit verify`), or the key was made by hand for a "
            "database from an older release (start the gateway once with no file at that path to seal it)"
        )
    if not older and not made:
        if not new_file:
            raise AuditIntegrityError(
                f"the audit database has no records and no creation marker, and the audit head key {key_path} "
                "already exists: its records and audit_meta were deleted or the file was emptied (run `pvegate "
                "audit verify`, check your checkpoints), or a start failed before sealing it; keep the file as "
                "evidence and move it aside to start a new chain"
            )
        if create_key:  # SQLite: a new file next to an existing key
            notes.append(
                f"started a new audit chain with the existing audit head key (key id {key.key_id}): "
                "if the previous database was not moved aside on purpose, it was removed"
            )
    start = (0, GENESIS)
    if "anchor" in meta:  # an older release's anchor, trusted as that release trusted it
        start = _point(_doc(meta["anchor"], "archive anchor (audit_meta 'anchor')"), "archive anchor")
    checker = ChainChecker(*start)
    for r in con.execute("SELECT * FROM audit ORDER BY seq"):
        if not checker.feed(dict(r)):
            raise AuditIntegrityError(
                f"the existing audit chain does not verify ({checker.problem}), so it was not sealed: "
                "keep the file as evidence and move it aside to start a new chain",
                checker.bad_seq,
            )
    seq, digest = checker.expect_seq - 1, checker.prev
    if "head" in meta and _point(_doc(meta["head"], "chain head"), "chain head") != (seq, digest):
        raise AuditIntegrityError(
            f"the existing chain ends at record {seq}, not at the head its writer recorded: records were "
            "removed, so it was not sealed; keep the file as evidence and move it aside to start a new chain"
        )
    db_id, now = uuid.uuid4().hex, time.time()
    sealed_at = {"seq": seq, "hash": digest} if older else None
    _upsert(con, "created", key.sign("created", {"db": db_id, "ts": now, "key_id": key.key_id, "sealed_at": sealed_at}))
    _upsert(con, "head", key.sign("head", {"db": db_id, "seq": seq, "hash": digest, "ts": now}))
    if "anchor" in meta:
        _upsert(con, "anchor", key.sign("anchor", {"db": db_id, "seq": start[0], "hash": start[1], "file": None}))
    con.execute("DELETE FROM audit_meta WHERE key = 'fresh'")
    if older:
        notes.append(
            f"sealed the existing audit chain (records up to {seq}, verified) with the audit head key; "
            "records written before this were not protected by a key"
        )
    return Seal(key, db_id, tuple(notes), head=(seq, now), head_hash=digest, new_chain=not older)


# --- operator side: plain sqlite3, used by the CLI and the admin API ---------------------


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def connect(path: Path | PgLocation, *, readonly: bool = False) -> Any:
    """A blocking connection to the audit: sqlite3's, or PgConnection (the same calls) on PostgreSQL."""
    if isinstance(path, PgLocation):
        return PgConnection(path, readonly=readonly)
    if not path.exists():
        raise FileNotFoundError(f"no audit database at {path}")
    # a file: URI with the path percent-encoded: a `#` or `?` in it is part of the name, not a fragment or query
    uri = path.absolute().as_uri() + ("?mode=ro" if readonly else "")
    con = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0)
    con.row_factory = sqlite3.Row
    # text that is not UTF-8 (written below the gateway) is read with its bytes kept as lone surrogates, so
    # the record it is in is named (`damage`) instead of the whole read failing; pvegate's text never has them
    con.text_factory = _lenient_text
    con.execute("PRAGMA busy_timeout=10000")
    return con


def _meta(con: Any, key: str) -> Any:
    try:
        row = con.execute("SELECT value FROM audit_meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.OperationalError:
        return None
    return json.loads(row[0]) if row else None


@dataclass
class VerifyResult:
    ok: bool
    checked: int
    first_seq: int | None = None
    last_seq: int | None = None
    head_hash: str | None = None
    bad_seq: int | None = None
    problem: str | None = None
    anchor: dict[str, Any] | None = None
    archives: list[str] = field(default_factory=list)  # archive files verified before the database
    sealed_at: int | None = None  # an older database: the record up to which it was sealed when upgraded
    checkpoint: int | None = None  # the checkpoint's record, found unchanged
    high_water: int | None = None  # the high-water mark of this chain next to the key, found at or below the head
    high_water_file: str | None = None
    unreachable: bool = False  # nothing was checked: the database could not be reached (not a finding)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# the record's columns that always hold text, and those that may be NULL
_TEXT = ("request_id", "kind", "body", "prev_hash", "hash")
_TEXT_OR_NULL = ("principal", "tool", "target", "outcome")
_TS_RANGE = (-62135596800.0, 253402300800.0)  # the years 1..9999: what a time can be shown as


def damage(row: dict[str, Any]) -> str | None:
    """What makes a stored record one pvegate never writes (the end of a sentence: "its body is not UTF-8
    text"), or None: a column of another type (a BLOB, a number), text that is not UTF-8 (read as
    SQLite's bytes with their undecodable bytes kept, see `connect`), a time that is no time."""
    ts = row.get("ts")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return f"its time is not a number ({_shown(ts)})"
    if not (math.isfinite(ts) and _TS_RANGE[0] < ts < _TS_RANGE[1]):
        return f"its time is out of range ({ts!r})"
    for col in _TEXT + _TEXT_OR_NULL:
        value = row.get(col)
        if value is None and col in _TEXT_OR_NULL:
            continue
        if isinstance(value, bytes):
            return f"its {col} is a BLOB, not text"
        if not isinstance(value, str):
            return f"its {col} is not text ({type(value).__name__})"
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"its {col} is not UTF-8 text"
    return None


def _shown(value: Any, limit: int = 80) -> str:
    """A column's value as a line may print it (undecodable bytes escaped, never an encoding error)."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return one_line(cut(text, limit))  # a newline or terminal escape in it would forge a line of the listing


class ChainChecker:
    """Walks records in seq order and reports the first break in the chain."""

    def __init__(self, seq: int, prev_hash: str, checkpoint: tuple[int, str] | None = None) -> None:
        self.expect_seq = seq + 1
        self.prev = prev_hash
        self.checked = 0
        self.bad_seq: int | None = None
        self.problem: str | None = None
        self.checkpoint = checkpoint  # (seq, hash) a record must still have
        self.checkpoint_seen = checkpoint is not None and checkpoint == (seq, prev_hash)

    @property
    def end(self) -> tuple[int, str]:
        return self.expect_seq - 1, self.prev

    def feed(self, row: dict[str, Any]) -> bool:
        seq = row.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            return self._fail(
                self.expect_seq, f"the record after record {self.expect_seq - 1} was changed: its seq is not a number"
            )
        if seq < self.expect_seq:
            return self._fail(seq, f"record {seq} is inserted before record {self.expect_seq - 1} (out of order)")
        if seq > self.expect_seq:
            missing = f"{self.expect_seq}" if seq == self.expect_seq + 1 else f"{self.expect_seq}..{seq - 1}"
            return self._fail(self.expect_seq, f"record {missing} is missing (deleted)")
        problem = damage(row)
        if problem is not None:
            return self._fail(seq, f"record {seq} was changed: {problem}")
        if row["prev_hash"] != self.prev:
            return self._fail(
                seq,
                f"record {seq} does not link to record {seq - 1}: a record was inserted or reordered here, "
                f"or record {seq - 1} was rewritten",
            )
        if row_hash(row) != row["hash"]:
            return self._fail(seq, f"record {seq} was changed: its content does not match its hash")
        if self.checkpoint is not None and seq == self.checkpoint[0]:
            if row["hash"] != self.checkpoint[1]:
                return self._fail(
                    seq, f"record {seq} is not the record of the checkpoint: the chain up to it was rewritten"
                )
            self.checkpoint_seen = True
        self.prev = str(row["hash"])
        self.expect_seq = seq + 1
        self.checked += 1
        return True

    def _fail(self, seq: int, problem: str) -> bool:
        self.bad_seq, self.problem = seq, problem
        return False


class _Bad(Exception):
    def __init__(self, problem: str, seq: int | None = None) -> None:
        super().__init__(problem)
        self.problem, self.seq = problem, seq


class _Unreachable(Exception):
    """The PostgreSQL audit could not be connected to (down, refused login, no such database, its password
    unreadable): nothing was read, so nothing can be said of the chain."""


def _key_for(path: Path | PgLocation, key: Path | None) -> Path:
    """The head key file: given, or audit-head.key next to a SQLite file (PostgreSQL has no "next to")."""
    if key is not None:
        return key
    if isinstance(path, PgLocation):
        raise AuditKeyError("the audit head key file is not given (--key, or audit.head_key_file in the configuration)")
    return default_key_path(path)


def verify(
    path: Path | PgLocation, archives: Iterable[Path] = (), *, key: Path | None = None, checkpoint: Path | None = None
) -> VerifyResult:
    """Check the chain (from archives when it was archived), its authenticated head and creation
    marker, and optionally that it still holds a checkpoint's record. Never raises: whatever
    is wrong (a tampered, unreadable or garbled database, a missing or wrong key) is a sentence."""
    state: dict[str, Any] = {"checked": 0, "first": None}
    try:
        return _verify(path, list(archives), _key_for(path, key), checkpoint, state)
    except (_Bad, AuditIntegrityError) as exc:
        problem, seq = exc.problem, exc.seq
    except _Unreachable as exc:
        return VerifyResult(False, 0, problem=str(exc), unreachable=True)
    except AuditKeyError as exc:
        problem, seq = f"{exc}: the chain head cannot be authenticated without it (give the right one with --key)", None
    except sqlite3.OperationalError as exc:
        if _busy(exc):  # another process holds the file: nothing was checked, not a finding about the audit
            return VerifyResult(False, 0, problem=f"{path} is locked by another process ({exc})", unreachable=True)
        problem, seq = f"{path} cannot be read as an audit database ({exc})", None
    except sqlite3.Error as exc:
        problem, seq = f"{path} cannot be read as an audit database ({exc})", None
    except OSError as exc:
        problem, seq = f"{exc.filename or path} cannot be read ({exc.strerror})", None
    except Exception as exc:  # anything else in a garbled file is still a sentence, not a traceback
        problem, seq = f"the audit data is garbled ({type(exc).__name__}: {exc})", None
    return VerifyResult(False, state["checked"], state["first"], bad_seq=seq, problem=problem)


def _busy(exc: sqlite3.OperationalError) -> bool:
    """SQLite's "database is locked" / "database table is locked" (SQLITE_BUSY, SQLITE_LOCKED) after the wait."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "is locked" in str(exc)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0] if lines else type(exc).__name__


# SQLite's own statistics tables (ANALYZE, PRAGMA optimize): they steer the query planner, never a result
_SQLITE_STATS = ("sqlite_stat1", "sqlite_stat2", "sqlite_stat3", "sqlite_stat4")
_expected_shapes: dict[tuple[str, str], set[tuple[Any, ...]]] | None = None


def _object_shape(con: sqlite3.Connection, kind: str, name: str, table: str) -> tuple[Any, ...]:
    """What an object is, as SQLite parses it (not its stored text): a table's columns; an index's table,
    columns, uniqueness and whether it is partial; a trigger's or view's text as written."""
    q = quote_ident(name)
    if kind == "table":
        return tuple(tuple(r[1:]) for r in con.execute(f"PRAGMA table_xinfo({q})"))
    if kind == "index":
        flags = [tuple(r[2:]) for r in con.execute(f"PRAGMA index_list({quote_ident(table)})") if r[1] == name]
        return (table, tuple(tuple(r[1:]) for r in con.execute(f"PRAGMA index_xinfo({q})")), tuple(flags))
    row = con.execute("SELECT sql FROM sqlite_master WHERE type = ? AND name = ?", (kind, name)).fetchone()
    return (table, " ".join(str(row[0] if row else "").split()))


def _expected_schema() -> dict[tuple[str, str], set[tuple[Any, ...]]]:
    """Every (type, name) the stores of this pvegate make in the SQLite file, with each shape it has at any
    of their versions (a file may hold another store at an older version): built once, in memory."""
    global _expected_shapes
    if _expected_shapes is None:
        from gateway.store import approvals_schema, handoffs, shared_keys  # the file's other stores

        sqlite_components = (MIGRATIONS, approvals_schema.MIGRATIONS, shared_keys.MIGRATIONS, handoffs.MIGRATIONS)

        shapes: dict[tuple[str, str], set[tuple[Any, ...]]] = {}
        con = sqlite3.connect(":memory:")
        try:
            con.execute(migrations.VERSIONS_TABLE)
            for component in sqlite_components:
                for script in component["sqlite"]:
                    for stmt in migrations.statements(script):
                        con.execute(stmt)
                    for kind, name, table in con.execute("SELECT type, name, tbl_name FROM sqlite_master").fetchall():
                        shapes.setdefault((kind, name), set()).add(_object_shape(con, kind, name, table))
        finally:
            con.close()
        _expected_shapes = shapes
    return _expected_shapes


def _check_schema(con: Any, postgresql: bool) -> None:
    """The database is what this pvegate makes: its audit schema version is not newer than this pvegate's;
    on SQLite, the file is sound (PRAGMA integrity_check: every index holds exactly its table's rows) and
    holds no table, index, trigger or view, and no column, that its stores do not make. A reader that
    filters (search, export, replay) goes through the file's indexes, which a full scan never sees."""
    known = len(MIGRATIONS["postgresql" if postgresql else "sqlite"])
    if postgresql:
        present = con.execute("SELECT to_regclass('pvegate_schema') IS NOT NULL").fetchone()[0]
    else:
        present = con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pvegate_schema'").fetchone()
    if present:
        row = con.execute("SELECT version FROM pvegate_schema WHERE component = 'audit'").fetchone()
        try:
            found = None if row is None else migrations.number("audit", row[0])
        except migrations.SchemaError as exc:
            raise _Bad(str(exc)) from None
        if found is not None and found > known:
            raise _Bad(migrations._newer("audit", found, known))
    if postgresql:
        problem = pg_objects_problem(con)
        if problem is not None:
            raise _Bad(problem)
        return
    problems = [str(r[0]) for r in con.execute("PRAGMA integrity_check")]
    if problems != ["ok"]:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise _Bad(
            "the database file is corrupt or was edited below SQL (PRAGMA integrity_check: "
            f"{'; '.join(problems[:3])}{more}): readers that use its indexes would not see what verify sees"
        )
    expected = _expected_schema()
    found = con.execute("SELECT type, name, tbl_name FROM sqlite_master ORDER BY type, name").fetchall()
    for kind, name, table in found:
        if name in _SQLITE_STATS:
            continue
        shapes = expected.get((kind, name))
        if shapes is None:
            raise _Bad(
                f"the database holds a {kind} {name!r} (on {table}) that pvegate does not make: it was added "
                "outside the gateway, and readers that filter records may go through it; drop it "
                "(keep a copy of the file as evidence first)"
            )
        if _object_shape(con, kind, name, table) not in shapes:
            if kind == "table" and name == "audit":
                cols = [str(r[1]) for r in con.execute("PRAGMA table_xinfo(audit)")]
                extra = [c for c in cols if c not in COLUMNS]
                if extra or len(cols) != len(COLUMNS):
                    raise _Bad(
                        f"the audit table has columns pvegate does not make ({', '.join(extra) or 'changed'}): "
                        "it was altered outside the gateway"
                    )
            raise _Bad(f"the {kind} {name!r} is not the one pvegate makes: it was changed outside the gateway")


# PostgreSQL: the audit's tables as MIGRATIONS makes them: (column, type, NOT NULL, generated) in order
_PG_TABLES: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "audit": (
        ("seq", "bigint", True),
        ("ts", "double precision", True),
        ("request_id", "text", True),
        ("kind", "text", True),
        ("principal", "text", False),
        ("tool", "text", False),
        ("target", "text", False),
        ("outcome", "text", False),
        ("body", "text", True),
        ("prev_hash", "text", True),
        ("hash", "text", True),
    ),
    "audit_meta": (("key", "text", True), ("value", "text", True)),
}
_PG_KINDS = {"v": "view", "m": "materialized view", "p": "partitioned table", "f": "foreign table", "S": "sequence"}


def _char(value: Any) -> str:
    """A PostgreSQL "char" column's value (the driver gives bytes)."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    return "" if value is None else str(value).strip("\x00")


# Operators and functions, outside the catalog and not part of an extension, named like a catalog one and
# taking only catalog types: put first by a role's or database's search_path, `principal = $1` would call one
# (a forged `public.=` for text hides records from search, export, replay and reconciliation, while verify's
# full scan compares no text). pvegate's sessions pin the catalog first; verify still names them.
_PG_SHADOWS = """
SELECT 'operator ' || n.nspname || '.' || o.oprname || '(' || concat_ws(', ',
       CASE WHEN o.oprleft <> 0 THEN format_type(o.oprleft, NULL) END,
       CASE WHEN o.oprright <> 0 THEN format_type(o.oprright, NULL) END) || ')' AS what
FROM pg_operator o JOIN pg_namespace n ON n.oid = o.oprnamespace
WHERE n.nspname = ANY(?::text[])
  AND EXISTS (SELECT 1 FROM pg_operator c WHERE c.oprnamespace = 'pg_catalog'::regnamespace AND c.oprname = o.oprname)
  AND NOT EXISTS (SELECT 1 FROM pg_type t WHERE t.oid IN (o.oprleft, o.oprright)
                  AND t.typnamespace <> 'pg_catalog'::regnamespace)
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_operator'::regclass AND d.objid = o.oid
                  AND d.deptype = 'e')
UNION ALL
SELECT 'function ' || n.nspname || '.' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = ANY(?::text[])
  AND EXISTS (SELECT 1 FROM pg_proc c WHERE c.pronamespace = 'pg_catalog'::regnamespace AND c.proname = p.proname
              AND c.proargtypes = p.proargtypes)
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                  AND d.deptype = 'e')
ORDER BY 1
"""


def _pg_shadows(con: Any, schemas: list[str]) -> str | None:
    names = [*schemas, "public"]
    found = [str(r[0]) for r in con.execute(_PG_SHADOWS, (names, names))]
    if not found:
        return None
    return (
        f"the database has {found[0]}" + (f" (and {len(found) - 1} more)" if len(found) > 1 else "") + ", named "
        "like a PostgreSQL built-in: put first in a search_path it would change what readers' comparisons match "
        "(pvegate pins pg_catalog first); pvegate never makes one: keep a copy as evidence, then drop it"
    )


def pg_objects_problem(con: Any) -> str | None:
    """PostgreSQL: whether `audit` and `audit_meta`, as every reader names them (unqualified, through the
    search_path), are the ordinary tables pvegate makes in the schema it makes them in (the first of the
    search_path after pg_catalog), with nothing that shows a reader other rows than a full scan sees, or
    changes what is written: no view or other object in their place, no rule, no trigger, no row-level
    security, no column changed, no operator or function named like a built-in one (_PG_SHADOWS).
    verify walks the chain with the same unqualified name, so such an object could let it pass while
    search, export, the admin API and replay are shown (or the writer stores) something else. None: sound."""
    schemas = [str(n) for n in con.execute("SELECT current_schemas(false)").fetchone()[0] or []]
    # the connection's search_path has pg_catalog first, then the role's own (db.pinned_search_path)
    schema = schemas[1] if len(schemas) > 1 and schemas[0] == "pg_catalog" else schemas[0] if schemas else None
    shadow = _pg_shadows(con, [n for n in schemas if n != "pg_catalog"])
    if shadow:
        return shadow
    for name, columns in _PG_TABLES.items():
        row = con.execute(
            "SELECT c.oid, n.nspname, c.relkind, c.relrowsecurity, c.relforcerowsecurity "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(?::text)",
            (name,),
        ).fetchone()
        if row is None:
            return f"there is no {name} table (in the search_path of this connection): it was renamed or dropped"
        oid, nsp, relkind, rls, force = row[0], row[1], _char(row[2]), row[3], row[4]
        if relkind != "r":
            what = _PG_KINDS.get(str(relkind), f"relation of kind {relkind!r}")
            return (
                f"{name} is a {what} ({nsp}.{name}), not the table pvegate makes: readers that name it would not "
                "see what the table holds (keep a copy of the database as evidence, then restore the table)"
            )
        if nsp != schema:
            return (
                f"{name} resolves to {nsp}.{name}, not to the table in schema {schema} where pvegate makes it: "
                "another schema in the search_path shadows it"
            )
        rules = [str(r[0]) for r in con.execute("SELECT rulename FROM pg_rewrite WHERE ev_class = ?::oid", (oid,))]
        if rules:
            return (
                f"the {name} table has a rule ({', '.join(sorted(rules))}) that pvegate does not make: it was added "
                "outside the gateway and can change what is read or written; drop it (keep a copy as evidence first)"
            )
        triggers = [
            str(r[0])
            for r in con.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = ?::oid AND NOT tgisinternal", (oid,))
        ]
        if triggers:
            return (
                f"the {name} table has a trigger ({', '.join(sorted(triggers))}) that pvegate does not make: it was "
                "added outside the gateway and can change what is written; drop it (keep a copy as evidence first)"
            )
        if rls or force:
            return (
                f"row-level security is enabled on the {name} table (pvegate never enables it): its policies can "
                f"hide records from some readers; ALTER TABLE {name} DISABLE ROW LEVEL SECURITY (keep a copy first)"
            )
        found = [
            (str(r[0]), str(r[1]), bool(r[2]), _char(r[3]))
            for r in con.execute(
                "SELECT attname, format_type(atttypid, atttypmod), attnotnull, attgenerated FROM pg_attribute "
                "WHERE attrelid = ?::oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (oid,),
            )
        ]
        if found != [(c, t, nn, "") for c, t, nn in columns]:
            return f"the {name} table's columns are not the ones pvegate makes: it was altered outside the gateway"
    return None


def _verify(
    path: Path | PgLocation, archived: list[Path], key_path: Path, checkpoint: Path | None, state: dict[str, Any]
) -> VerifyResult:
    if isinstance(path, Path) and not path.is_file():
        raise _Bad(f"there is no audit database at {path}")
    # the high-water mark is read before the database's snapshot: a gateway running meanwhile writes it
    # only after its head moved, so a mark read first never names a record past the head read next
    hwm_file = mark_path(key_path)
    hwm_text = mark_text(hwm_file)
    if isinstance(path, PgLocation):
        try:
            con = connect(path, readonly=True)
        except Exception as exc:
            raise _Unreachable(f"could not connect to {path} ({_first_line(exc)})") from exc
    else:
        con = connect(path, readonly=True)
    try:
        # one snapshot for the head and the records: a live gateway commits between two separate
        # reads, and its new records would look added outside the gateway
        con.execute("BEGIN")
        _check_schema(con, isinstance(path, PgLocation))
        meta = _meta_all(con)
        if "created" not in meta:  # says so whether or not a key is at hand
            raise AuditIntegrityError(NO_MARKER)
        key = HeadKey.load(key_path)
        db_id = check_created(key, meta)
        seal = Seal(key, db_id)
        created = _doc(meta["created"], "creation marker")
        sealed_at = created.get("sealed_at")
        head_text = meta.get("head")
        if head_text is None:
            raise _Bad("the chain head (audit_meta 'head') is missing: it was deleted")
        anchor = check_anchor(key, db_id, meta.get("anchor"))
        mark = _load_checkpoint(checkpoint, key, db_id) if checkpoint is not None else None
        used: list[Path] = []
        if anchor is not None:
            used = archived or _recorded_archives(meta, anchor)
            checker = _verify_archives(used, key, db_id, mark, state)
            if checker.end != _point(anchor, "archive anchor"):
                raise _Bad(
                    f"the archives end at record {checker.end[0]} but the database continues from anchor record "
                    f"{anchor['seq']}: an archive is missing or the anchor was changed",
                    anchor["seq"] + 1,
                )
        elif archived:
            raise _Bad("the database was never archived (it has no anchor), so no archive comes before it", 1)
        else:
            checker = ChainChecker(0, GENESIS, mark)
        for r in con.execute("SELECT * FROM audit ORDER BY seq"):
            row = dict(r)
            state["first"] = row["seq"] if state["first"] is None else state["first"]
            ok = checker.feed(row)
            state["checked"] = checker.checked
            if not ok:
                raise _Bad(checker.problem or "the chain breaks", checker.bad_seq)
        last = None if state["first"] is None else checker.end
        head_seq, _ = check_head(seal, head_text, last, meta.get("anchor"))
        try:
            hwm = read_mark(hwm_file, key, hwm_text)
        except MarkError as exc:
            raise _Bad(str(exc)) from None
        high_water: int | None = None
        if hwm is not None and hwm["db"] == db_id:
            high_water = int(hwm["seq"])
            if high_water > head_seq:
                raise _Bad(
                    f"records at the end are missing: the head is at seq {head_seq} but seq {high_water} was "
                    f"reached (high-water mark at {hwm_file}): an older head was put back, or an older copy of "
                    "the database restored",
                    head_seq + 1,
                )
            if isinstance(hwm.get("hash"), str):  # a mark with its record's hash (archived beyond the anchor: gone)
                got = con.execute("SELECT hash FROM audit WHERE seq = ?", (high_water,)).fetchone()
                now = str(got[0]) if got is not None else None
                if got is None and anchor is not None and high_water == anchor["seq"]:
                    now = str(anchor["hash"])
                if now is not None and now != hwm["hash"]:
                    raise _Bad(_forked(high_water, hwm_file), high_water)
        if mark is not None and not checker.checkpoint_seen:
            if mark[0] > checker.end[0]:
                raise _Bad(
                    f"record {checker.end[0] + 1}..{mark[0]} is missing: the checkpoint names record {mark[0]} but "
                    f"the chain ends at {checker.end[0]} (records were removed, or an older copy was restored)",
                    checker.end[0] + 1,
                )
            raise _Bad(f"the checkpoint's record {mark[0]} is in an archive that was not given (use --archive)")
        return VerifyResult(
            True,
            checker.checked,
            state["first"],
            checker.end[0],
            checker.end[1],
            anchor=anchor,
            archives=[str(p) for p in used],
            sealed_at=int(sealed_at["seq"]) if isinstance(sealed_at, dict) else None,
            checkpoint=None if mark is None else mark[0],
            high_water=high_water,
            high_water_file=str(hwm_file) if hwm is not None and hwm["db"] == db_id else None,
        )
    finally:
        con.close()


def _forked(seq: int, mark: Path) -> str:
    return (
        f"record {seq} is not the record the high-water mark ({mark}) names: the chain was cut and written "
        "again from an older head (records from there on replaced), outside the gateway"
    )


def _load_checkpoint(file: Path, key: HeadKey, db_id: str) -> tuple[int, str]:
    try:
        doc = json.loads(file.read_text())
    except OSError as exc:
        raise _Bad(f"the checkpoint file {file} cannot be read ({exc.strerror})") from None
    except ValueError:
        raise _Bad(f"the checkpoint file {file} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("type") != CHECKPOINT_TYPE:
        raise _Bad(f"{file} is not a pvegate audit checkpoint")
    head = {k: doc.get(k) for k in ("db", "seq", "hash", "ts", "mac")}
    if not key.check("head", head):
        raise _Bad(
            f"the checkpoint {file} is not authenticated by the audit head key: "
            "it was changed, or made with another key"
        )
    if head["db"] != db_id:
        raise _Bad(f"the checkpoint {file} is from another audit database (id {head['db']}, this one is {db_id})")
    return _point(head, "checkpoint")


def _recorded_archives(meta: dict[str, str], anchor: dict[str, Any]) -> list[Path]:
    """The archive files audit_meta lists, from the oldest one still on disk (all must be there after it)."""
    try:
        listed = [Path(str(a["file"])) for a in json.loads(meta.get("archives", "[]"))]
    except (ValueError, TypeError, KeyError):
        listed = []
    present: list[Path] = []
    for p in reversed(listed):
        if not p.is_file():
            break
        present.insert(0, p)
    if not present:
        where = f" (the last one was {listed[-1]})" if listed else ""
        raise _Bad(
            f"records up to {anchor['seq']} were archived{where} and verify needs the archive the anchor points to: "
            "give the archives with --archive, oldest first",
            anchor["seq"],
        )
    return present


def _verify_archives(
    files: list[Path], key: HeadKey, db_id: str, mark: tuple[int, str] | None, state: dict[str, Any]
) -> ChainChecker:
    checker: ChainChecker | None = None
    for path in files:
        with path.open(encoding="utf-8") as fh:
            try:
                header = json.loads(fh.readline())
            except ValueError:
                header = None
            if not isinstance(header, dict) or header.get("type") != "pvegate-audit-archive":
                raise _Bad(f"{path} is not a pvegate audit archive")
            start = _point(_obj(header.get("anchor"), path), f"anchor in {path}")
            signed = "mac" in header
            if signed and (not key.check("archive", header) or header.get("db") != db_id):
                raise _Bad(
                    f"{path}: its header is not authenticated by the audit head key (changed, or from another database)"
                )
            if checker is None:  # the start must be the genesis or vouched for by the key
                if start != (0, GENESIS) and not signed:
                    raise _Bad(
                        f"{path} continues from record {start[0]} and carries no MAC (made before keyed heads): "
                        "give the archives before it too"
                    )
                checker = ChainChecker(*start, checkpoint=mark)
            elif checker.end != start:
                raise _Bad(
                    f"{path} continues from record {start[0]} but the archive before it ends at record "
                    f"{checker.end[0]}: an archive is missing or out of order",
                    checker.end[0] + 1,
                )
            for line in fh:
                if not checker.feed(_obj(json.loads(line), path)):
                    raise _Bad(f"{path}: {checker.problem}", checker.bad_seq)
                state["checked"] = checker.checked
        if checker.end != _point(_obj(header.get("last"), path), f"last record in {path}"):
            raise _Bad(f"{path}: its records do not end where its header says")
    if checker is None:
        raise _Bad("no archive was given")
    return checker


def _obj(doc: Any, path: Path) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise _Bad(f"{path} is garbled (a line is not a JSON object)")
    return doc


CHECKPOINT_TYPE = "pvegate-audit-checkpoint"


def checkpoint(path: Path | PgLocation, *, key: Path | None = None) -> dict[str, Any]:
    """The authenticated head as a document to keep off the host (raises a sentence if it does not hold)."""
    k = HeadKey.load(_key_for(path, key))
    con = connect(path, readonly=True)
    try:
        con.execute("BEGIN")  # the head and the last record from one snapshot
        meta = _meta_all(con)
        seal = Seal(k, check_created(k, meta))
        row = con.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        check_head(seal, meta.get("head"), None if row is None else (int(row[0]), str(row[1])), meta.get("anchor"))
        con.execute("COMMIT")
    finally:
        con.close()
    head = _doc(meta["head"], "chain head")
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(head["ts"])))
    return {"type": CHECKPOINT_TYPE, "time": when, "key_id": k.key_id, **head}


# --- reading, exporting, archiving ------------------------------------------------------------


@dataclass
class Query:
    principal: str | None = None
    tool: str | None = None
    target: str | None = None
    outcome: str | None = None
    kind: str | None = None
    request_id: str | None = None
    since: float | None = None
    until: float | None = None
    after_seq: int | None = None
    limit: int | None = None
    newest_first: bool = False

    def sql(self, postgresql: bool = False) -> tuple[str, list[Any]]:
        where, args = [], []
        for col in ("principal", "tool", "target", "outcome", "kind", "request_id"):
            value = getattr(self, col)
            if value is None:
                continue
            if "*" in value and postgresql:  # the same glob as LIKE: * any run, ? one character
                where.append(f"{col} LIKE ? ESCAPE '\\'")
                value = _glob_like(value)
            elif "*" in value:  # shell-style glob, e.g. --target 'default/qemu/*'
                where.append(f"{col} GLOB ?")
                value = _brackets_literal(value)
            else:
                where.append(f"{col} = ?")
            args.append(value)
        if self.since is not None:
            where.append("ts >= ?")
            args.append(self.since)
        if self.until is not None:
            where.append("ts < ?")
            args.append(self.until)
        if self.after_seq is not None:
            where.append("seq > ?")
            args.append(self.after_seq)
        # only fixed column names and placeholders are joined here; values are bound
        sql = f"SELECT {', '.join(COLUMNS)} FROM audit" + (" WHERE " + " AND ".join(where) if where else "")  # noqa: S608
        sql += " ORDER BY seq DESC" if self.newest_first else " ORDER BY seq"
        if self.limit is not None:
            sql += " LIMIT ?"
            args.append(int(self.limit))
        return sql, args


def filter_matches(value: str, pattern: str) -> bool:
    """An audit filter applied in Python exactly as `Query.sql` applies it in the database: a glob
    only when it holds a `*` (`ops[1]` or `ops?` is a name), `*` any run, `?` one character."""
    return fnmatch.fnmatchcase(value, _brackets_literal(pattern)) if "*" in pattern else value == pattern


def _brackets_literal(glob: str) -> str:
    """`[` as itself, as on PostgreSQL: a glob would read `renovate[bot]*` as a character class."""
    return glob.replace("[", "[[]")


def _glob_like(glob: str) -> str:
    out = []
    for ch in glob:
        if ch in "\\%_":
            out.append("\\" + ch)
        else:
            out.append({"*": "%", "?": "_"}.get(ch, ch))
    return "".join(out)


def search(path: Path | PgLocation, q: Query) -> list[dict[str, Any]]:
    con = connect(path, readonly=True)
    try:
        sql, args = q.sql(isinstance(path, PgLocation))
        rows = [dict(r) for r in con.execute(sql, args)]
    finally:
        con.close()
    return list(reversed(rows)) if q.newest_first else rows


def iter_rows(path: Path | PgLocation, q: Query) -> Iterator[dict[str, Any]]:
    con = connect(path, readonly=True)
    try:
        sql, args = q.sql(isinstance(path, PgLocation))
        if isinstance(path, PgLocation):
            con.execute("BEGIN")  # a snapshot, read through a cursor: an export is not held in memory
        for r in con.execute(sql, args):
            yield dict(r)
    finally:
        con.close()


class AuditDataError(ValueError):
    """A stored record cannot be read as a record (its body is not a JSON object): a sentence naming it."""


def body_or_empty(text: str | None) -> dict[str, Any]:
    """A record's body for a reader that can go on without it (a count, a hint): {} when it is not
    a JSON object (`audit verify` is where such a record is reported)."""
    try:
        doc = json.loads(text or "{}")
    except (TypeError, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def parse_body(row: dict[str, Any]) -> dict[str, Any]:
    """A record's body as an object, or AuditDataError naming the record."""
    problem = damage(row)
    if problem is not None:
        raise AuditDataError(
            f"record {_shown(row.get('seq'))} (request {_shown(row.get('request_id'))}, {_shown(row.get('kind'))}) "
            f"cannot be read: {problem} (changed outside the gateway: run `pvegate audit verify`)"
        )
    try:
        doc = json.loads(row["body"])
    except (TypeError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise AuditDataError(
            f"record {row.get('seq')} (request {row.get('request_id')}, {row.get('kind')}) cannot be read: its body "
            "is not a JSON object (written by a release that scrubbed secrets from the record's text, or changed "
            "outside the gateway: run `pvegate audit verify`)"
        )
    return doc


def export_line(row: dict[str, Any]) -> str:
    """One JSONL line: the record's columns (only those: a column added to the table outside the gateway
    is not exported), its body as an object; hashes kept so a SIEM can re-verify. A body that is not a
    JSON object, or a damaged record (`damage`), raises AuditDataError naming the record."""
    doc = {k: row[k] for k in COLUMNS}
    doc["body"] = parse_body(row)  # first: it says what is damaged before the time is read
    doc["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(row["ts"])) + f".{int(row['ts'] % 1 * 1e6):06d}Z"
    try:
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError) as exc:  # a body nested too deep to write back
        raise AuditDataError(
            f"record {row.get('seq')} (request {row.get('request_id')}, {row.get('kind')}) cannot be exported: "
            f"its body cannot be written as JSON ({type(exc).__name__}): run `pvegate audit verify`"
        ) from None


def _archive_line(row: dict[str, Any]) -> str:
    # archives keep the body as the exact stored text so every hash can be recomputed
    return json.dumps({k: row[k] for k in COLUMNS}, separators=(",", ":"))


@dataclass
class ArchiveResult:
    file: Path | None
    count: int
    first_seq: int | None = None
    last_seq: int | None = None
    last_hash: str | None = None


# The first record (of any kind) of every allowed call still open, and when it was written: where an archive's
# cut must stop.
_OPEN_CALLS_FIRST_SQL = f"""
SELECT MIN(a.seq), MIN(a.ts) FROM audit a WHERE a.request_id IN (SELECT o.request_id FROM ({OPEN_CALLS_SQL}) o)
"""  # noqa: S608 - fixed text

# How far before the earliest call a reconciliation pass settles it reads the records naming UPIDs (its
# claimed tasks, reconcile.claimed_tasks): a task a call could be matched to starts from the clock skew before
# its decision (the node's clock), and the record that claims it for another call (that call's dispatch or
# result) was stamped by its writer's clock, which may be behind this call's writer's or the node's (another
# replica, an earlier run, a clock stepped between runs). Generous: a claim read too many costs nothing, a
# claim missed lets one call's task be recorded as another's. The archive keeps these records too.
CLAIM_MARGIN_SECONDS = 3600


def archive(path: Path | PgLocation, before: float, out_dir: Path, *, key: Path | None = None) -> ArchiveResult:
    """Move records older than `before` to a JSONL file and delete them, keeping the chain verifiable.

    The file starts with a header naming the anchor it continues from and the last
    record it holds, authenticated with the audit head key; the database records that
    last record as its new (authenticated) anchor.

    Reading, verifying and writing the file happen in a read snapshot, while gateways go on
    appending. Only the delete and the new anchor take the writer's lock, in one short
    transaction after the file is fsynced, and only if no other archive moved the anchor
    meanwhile. A crash leaves either the old state or the new one (and perhaps a file the
    database does not list).
    """
    head_key = HeadKey.load(_key_for(path, key))
    out_dir = out_dir.resolve()  # listed as is: verify, run from any directory, finds the file by it
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # an existing directory keeps its mode
    with _archive_turn(out_dir):
        return _archive(path, before, out_dir, head_key)


@contextlib.contextmanager
def _archive_turn(out_dir: Path) -> Iterator[None]:
    """One archive at a time into a directory, from its snapshot to its commit: two runs started together
    (a timer and an operator) read the same chain and write the same file name, and the one refused at the
    commit would remove (or have overwritten) the file the other just listed, whose records are deleted.
    A lock on the directory itself (flock: freed when the process dies), so it leaves nothing in it."""
    fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"refusing to archive: another `pvegate audit archive` is writing to {out_dir}; run again when it "
                "is done"
            ) from None
        except OSError as exc:  # a file system that cannot lock a directory (NFS): the commit's check remains
            log.warning(
                "audit archive: cannot lock %s (%s); runs are not kept apart, a run refused at its commit still "
                "removes only its own file",
                out_dir,
                exc.strerror or exc,
            )
        yield
    finally:
        os.close(fd)  # frees the lock


def _archive(path: Path | PgLocation, before: float, out_dir: Path, head_key: HeadKey) -> ArchiveResult:
    con = connect(path)
    try:
        con.execute("BEGIN")  # a snapshot: appends go on, and are not seen
        try:
            try:  # a schema this pvegate does not know (newer), or objects it never makes: nothing is written
                _check_schema(con, isinstance(path, PgLocation))
            except _Bad as exc:
                raise ValueError(f"refusing to archive: {exc.problem}") from None
            meta = _meta_all(con)
            seal = Seal(head_key, check_created(head_key, meta))
            row = con.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
            # never archive (and so launder) a chain whose end or anchor was tampered with
            check_head(seal, meta.get("head"), None if row is None else (int(row[0]), str(row[1])), meta.get("anchor"))
            signed = check_anchor(head_key, seal.db_id, meta.get("anchor"))
            start = (0, GENESIS) if signed is None else _point(signed, "archive anchor")
            anchor = {"seq": start[0], "hash": start[1]}
            cut = con.execute("SELECT MAX(seq) FROM audit WHERE ts < ?", (before,)).fetchone()[0]
            # an allowed call with no settling record yet stays, with all its records and all that follows them:
            # reconciliation reads its decision, and its `received` record (before the decision: its target,
            # arguments, effect), from the database to settle it, whatever its age; without the target its
            # task search would take another call's task
            oldest = con.execute(_OPEN_CALLS_FIRST_SQL, (-math.inf, math.inf)).fetchone()
            if cut is not None and oldest is not None and oldest[0] is not None:
                cut = min(cut, int(oldest[0]) - 1)  # at or below the anchor: nothing to archive
                # and the task claims its search reads, from the margin before it (claimed_tasks): archived, a
                # task another call started and recorded could be taken for this one's
                # (the first record stamped within the margin, not the last one before it: a lagging writer's
                # record may follow a claim in seq and still be stamped before the margin)
                claims = con.execute(
                    "SELECT MIN(seq) FROM audit WHERE ts >= ?", (float(oldest[1]) - CLAIM_MARGIN_SECONDS,)
                )
                first = claims.fetchone()[0]
                if first is not None:
                    cut = min(cut, int(first) - 1)
            rows = (
                []
                if cut is None
                else [dict(r) for r in con.execute("SELECT * FROM audit WHERE seq <= ? ORDER BY seq", (cut,))]
            )
        finally:
            con.execute("ROLLBACK")
        if not rows:
            return ArchiveResult(None, 0)
        checker = ChainChecker(*start)
        for r in rows:
            if not checker.feed(r):  # never archive (and so launder) a broken chain
                raise ValueError(f"refusing to archive: {checker.problem}")
        last = {"seq": rows[-1]["seq"], "hash": rows[-1]["hash"]}
        name = f"audit-{rows[0]['seq']:012d}-{last['seq']:012d}.jsonl"
        final = out_dir / name
        tmp = out_dir / (name + ".tmp")
        header = head_key.sign(
            "archive",
            {
                "type": "pvegate-audit-archive",
                "format": 2,
                "db": seal.db_id,
                "created_at": time.time(),
                "anchor": anchor,
                "first": {"seq": rows[0]["seq"], "hash": rows[0]["hash"]},
                "last": last,
                "count": len(rows),
            },
        )
        digest = hashlib.sha256()
        tmp.unlink(missing_ok=True)  # left by an archive that crashed: its records are all still in the database
        with private_file(tmp) as fh:  # 0600 whatever the umask, as the database the records come from
            for text in [json.dumps(header, separators=(",", ":"))] + [_archive_line(r) for r in rows]:
                fh.write(text + "\n")
                digest.update((text + "\n").encode())
            fh.flush()
            os.fsync(fh.fileno())
            mine = os.fstat(fh.fileno())
        tmp.replace(final)
        _fsync_dir(out_dir)

        con.execute("BEGIN IMMEDIATE")  # the writer's lock, for the delete and the anchor only
        try:
            got = con.execute("SELECT value FROM audit_meta WHERE key = 'anchor'").fetchone()
            end = con.execute("SELECT hash FROM audit WHERE seq = ?", (last["seq"],)).fetchone()
            moved = (None if got is None else str(got[0])) != meta.get("anchor")
            if moved or end is None or str(end[0]) != last["hash"]:
                con.execute("ROLLBACK")
                # nothing was deleted: the records are all still in the database. Only this run's own file is
                # removed: one put there by another run (a directory shared by hosts) may be the listed archive
                with contextlib.suppress(FileNotFoundError):
                    now = os.stat(final, follow_symlinks=False)
                    if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                        final.unlink()
                raise ValueError("refusing to archive: another archive moved the chain's anchor meanwhile; run again")
            listed = _meta(con, "archives") or []
            listed.append({"file": str(final), "sha256": digest.hexdigest(), **header})
            con.execute("DELETE FROM audit WHERE seq <= ?", (last["seq"],))
            _upsert(con, "anchor", head_key.sign("anchor", {"db": seal.db_id, **last, "file": name}))
            _upsert(con, "archives", listed)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:  # the file stays: a COMMIT whose answer was lost may have moved the rows
                con.execute("ROLLBACK")
            raise
        return ArchiveResult(final, len(rows), rows[0]["seq"], last["seq"], last["hash"])
    finally:
        con.close()


def private_file(path: Path) -> TextIO:
    """A new file for writing text, mode 0600 whatever the umask (an archive, an export: they hold what the
    database holds); one already there is refused (FileExistsError), never followed if a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def archives(path: Path | PgLocation) -> list[dict[str, Any]]:
    con = connect(path, readonly=True)
    try:
        return list(_meta(con, "archives") or [])
    finally:
        con.close()


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def known_secrets(config: Config) -> list[str]:
    """The gateway's own secret values, scrubbed from every record as a last line of defence."""
    refs = [cl.token for cl in config.clusters.values()]
    refs += [
        r
        for r in (config.auth.hs256_secret, config.admin.token, config.opa.token, config.metrics.token)
        if r is not None
    ]
    refs += service_secret_refs(config.opa.services)  # OPA's service credentials given as {file:}/{env:}
    if config.storage.password is not None:
        refs.append(config.storage.password)
    out: list[str] = []
    for ref in refs:
        try:
            value = ref.read()
        except (ConfigError, OSError):
            continue
        out.append(value)
        if "=" in value:  # a Proxmox API token "user@realm!id=uuid": its secret part alone too
            out.append(value.rsplit("=", 1)[1])
    return out


def audit_arguments(tool: Tool, args: dict[str, Any], redact: Any = ()) -> dict[str, Any]:
    return redact_arguments(tool.sensitive, args, redact if isinstance(redact, list) else ())
