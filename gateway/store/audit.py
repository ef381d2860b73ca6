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
import contextlib
import contextvars
import copy
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite

from gateway.core.config import Config, ConfigError
from gateway.tools.tool import Tool

GENESIS = "0" * 64
REDACTED = "[redacted]"
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


class Scrubber:
    """Replaces known secret values wherever they appear in a record's text."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._needles: list[str] = []
        for s in secrets:
            self.add(s)

    def add(self, secret: str) -> None:
        for form in _forms(secret):
            if form not in self._needles:
                self._needles.append(form)
        self._needles.sort(key=len, reverse=True)  # longest first: a token before its suffix

    def __call__(self, text: str | None, extra: tuple[str, ...] = ()) -> str | None:
        if text is None:
            return None
        needles = self._needles
        if extra:
            needles = sorted({f for s in extra for f in _forms(s)} | set(needles), key=len, reverse=True)
        for n in needles:
            if n in text:
                text = text.replace(n, REDACTED)
        return text


def _forms(secret: str) -> list[str]:
    """The secret as written raw and as it appears inside JSON strings."""
    secret = str(secret).strip()
    if len(secret) < MIN_SCRUB_LEN:
        return []
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    return [f for f in forms if len(f) >= MIN_SCRUB_LEN]


def dumps_body(body: dict[str, Any] | None) -> str:
    return json.dumps(body or {}, sort_keys=True, separators=(",", ":"), default=str)


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
    from gateway.tools.shaping import redact_path

    names = set(sensitive)

    def walk(doc: Any) -> Any:
        if isinstance(doc, dict):
            return {k: (REDACTED if k in names else walk(v)) for k, v in doc.items()}
        if isinstance(doc, list):
            return [walk(v) for v in doc]
        return doc

    out: dict[str, Any] = walk(copy.deepcopy(arguments))
    for path in paths:
        parts = path.split(".")
        redact_path(out, parts[1:] if parts[0] == "arguments" else parts)
    return out


class AuditClosed(Exception):
    """The audit log is closed; nothing more can be recorded (callers fail closed)."""


# (request_id, kind, principal, tool, target, outcome, body): a record as stored, before seq and hashes
_Row = tuple[str, str, str | None, str | None, str | None, str | None, str]
_Batch = tuple[tuple[_Row, ...], "asyncio.Future[None]"]


def utf8_safe(text: str) -> str:
    """The text as SQLite can store it (UTF-8). A lone surrogate (a client's JSON escape such as
    "\\ud800") is kept as its literal backslash escape, so the record is still written and chained."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _store_failure(exc: BaseException) -> bool:
    """An error of the database itself (locked, I/O, full), not of the records being written."""
    return isinstance(exc, sqlite3.OperationalError | AuditClosed)


def _settle(batch: list[_Batch], exc: BaseException | None) -> None:
    for _, fut in batch:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


class AuditLog:
    """Append-only audit log; one writer task per process, group commits."""

    def __init__(
        self,
        path: Path,
        *,
        secrets: Iterable[str] = (),
        synchronous: str = "FULL",
        max_batch: int = 512,
    ) -> None:
        self.path = path
        self.scrub = Scrubber(secrets)
        self.synchronous = synchronous
        self.max_batch = max_batch
        self._db: aiosqlite.Connection | None = None
        self._queue: asyncio.Queue[_Batch | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self.commits = 0  # transactions committed (for tests and metrics)
        self.records = 0
        self.counts: dict[tuple[str, str], int] = {}  # (kind, outcome) -> records written by this process

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path, isolation_level=None)
        await self._db.execute("PRAGMA busy_timeout=10000")
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute(f"PRAGMA synchronous={self.synchronous}")
        await self._db.executescript(SCHEMA)
        self._writer = asyncio.create_task(self._write_loop(), name="audit-writer")

    async def close(self) -> None:
        if self._writer is not None:
            await self._queue.put(None)  # drains what is queued, then stops
            await self._writer
            self._writer = None
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def append(self, *records: AuditRecord) -> None:
        """Queue records (kept together, in order); returns once they are committed."""
        if self._writer is None or self._writer.done():
            raise AuditClosed("audit log is not open")
        extra = CALL_SECRETS.get()
        # encoded here, in the caller's task: a record that cannot be encoded fails only its own call
        rows = tuple(self._prepare(r, extra) for r in records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put((rows, fut))
        await asyncio.shield(fut)  # a cancelled caller must not un-write a queued record

    def _prepare(self, rec: AuditRecord, extra: tuple[str, ...]) -> _Row:
        """The record's stored columns: scrubbed of secrets, serialised, and storable as UTF-8."""
        s = self.scrub
        scrub = rec.scrub + extra

        def col(text: str | None) -> str | None:
            return None if text is None else utf8_safe(s(text, scrub) or "")

        return (
            utf8_safe(str(rec.request_id)),
            utf8_safe(str(rec.kind)),
            col(rec.principal),
            col(rec.tool),
            col(rec.target),
            col(rec.outcome),
            utf8_safe(s(dumps_body(rec.body), scrub) or "{}"),
        )

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

    async def _commit(self, records: list[_Row]) -> None:
        db = self._db
        assert db is not None
        await db.execute("BEGIN IMMEDIATE")
        try:
            seq, prev = await _tail_async(db)
            rows = []
            for rec in records:
                seq += 1
                row = (seq, time.time(), *rec)
                digest = record_hash(prev, *row)
                rows.append((*row, prev, digest))
                prev = digest
            await db.executemany("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
            await db.execute(
                "INSERT INTO audit_meta(key, value) VALUES ('head', ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (json.dumps({"seq": seq, "hash": prev}),),
            )
            await db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                await db.execute("ROLLBACK")
            raise
        self.commits += 1
        self.records += len(records)
        for rec in records:
            key = (rec[1], rec[5] or "")
            self.counts[key] = self.counts.get(key, 0) + 1

    async def rows(self, request_id: str | None = None) -> list[dict[str, Any]]:
        assert self._db is not None
        sql = "SELECT * FROM audit"
        args: tuple[Any, ...] = ()
        if request_id:
            sql += " WHERE request_id = ?"
            args = (request_id,)
        async with self._db.execute(sql + " ORDER BY seq", args) as cur:
            fetched = await cur.fetchall()  # at once: no read stays open across the writer's awaits
        out = []
        for r in fetched:
            d = dict(zip(COLUMNS, r, strict=True))
            d["body"] = json.loads(d["body"])
            out.append(d)
        return out

    async def allowed_since(self, since: float) -> list[tuple[float, str, str]]:
        """(ts, principal, tool) of calls allowed or held for approval since `since`: usage counters' memory."""
        assert self._db is not None
        sql = (
            "SELECT ts, principal, tool FROM audit WHERE ts >= ? AND kind = 'decision' "
            "AND outcome IN ('allow', 'pending') "
            "AND principal IS NOT NULL AND tool IS NOT NULL ORDER BY ts"
        )
        async with self._db.execute(sql, (since,)) as cur:
            fetched = await cur.fetchall()
        return [(float(r[0]), str(r[1]), str(r[2])) for r in fetched]


async def _tail_async(db: aiosqlite.Connection) -> tuple[int, str]:
    # execute_fetchall: one trip to the database thread instead of three (execute, fetch, close)
    rows = list(await db.execute_fetchall("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"))
    if rows:
        return int(rows[0][0]), str(rows[0][1])
    meta = list(await db.execute_fetchall("SELECT value FROM audit_meta WHERE key = 'anchor'"))
    if meta:  # everything was archived: continue from the archive's anchor
        anchor = json.loads(meta[0][0])
        return int(anchor["seq"]), str(anchor["hash"])
    return 0, GENESIS


# --- operator side: plain sqlite3, used by the CLI and the admin API ---------------------


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    if not path.exists():
        raise FileNotFoundError(f"no audit database at {path}")
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    con = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0)
    con.row_factory = sqlite3.Row
    con.execute("PRAGMA busy_timeout=10000")
    return con


def _meta(con: sqlite3.Connection, key: str) -> Any:
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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ChainChecker:
    """Walks records in seq order and reports the first break in the chain."""

    def __init__(self, seq: int, prev_hash: str) -> None:
        self.expect_seq = seq + 1
        self.prev = prev_hash
        self.checked = 0
        self.bad_seq: int | None = None
        self.problem: str | None = None

    def feed(self, row: dict[str, Any]) -> bool:
        seq = int(row["seq"])
        if seq < self.expect_seq:
            return self._fail(seq, f"record {seq} is inserted before record {self.expect_seq - 1} (out of order)")
        if seq > self.expect_seq:
            missing = f"{self.expect_seq}" if seq == self.expect_seq + 1 else f"{self.expect_seq}..{seq - 1}"
            return self._fail(self.expect_seq, f"record {missing} is missing (deleted)")
        if row["prev_hash"] != self.prev:
            return self._fail(
                seq,
                f"record {seq} does not link to record {seq - 1}: a record was inserted or reordered here, "
                f"or record {seq - 1} was rewritten",
            )
        if row_hash(row) != row["hash"]:
            return self._fail(seq, f"record {seq} was changed: its content does not match its hash")
        self.prev = str(row["hash"])
        self.expect_seq = seq + 1
        self.checked += 1
        return True

    def _fail(self, seq: int, problem: str) -> bool:
        self.bad_seq, self.problem = seq, problem
        return False


def verify(path: Path, archives: Iterable[Path] = ()) -> VerifyResult:
    """Check the whole chain (optionally starting from archive files) and the recorded head."""
    con = connect(path, readonly=True)
    try:
        anchor = _meta(con, "anchor")
        head = _meta(con, "head")
        start_seq, start_hash = (int(anchor["seq"]), str(anchor["hash"])) if anchor else (0, GENESIS)
        checker = ChainChecker(0, GENESIS)
        archived = list(archives)
        if archived:
            for arch in archived:  # archives in order, then the database continues from the last one
                res = _verify_archive_into(arch, checker)
                if res is not None:
                    return res
            if (checker.expect_seq - 1, checker.prev) != (start_seq, start_hash):
                return VerifyResult(
                    False,
                    checker.checked,
                    bad_seq=start_seq + 1,
                    problem=(
                        f"the archives end at record {checker.expect_seq - 1} but the database continues "
                        f"from anchor record {start_seq}: an archive is missing or the anchor was changed"
                    ),
                    anchor=anchor,
                )
        else:
            checker = ChainChecker(start_seq, start_hash)
        first = None
        for r in con.execute("SELECT * FROM audit ORDER BY seq"):
            row = dict(r)
            first = row["seq"] if first is None else first
            if not checker.feed(row):
                return VerifyResult(
                    False, checker.checked, first, bad_seq=checker.bad_seq, problem=checker.problem, anchor=anchor
                )
        last_seq = checker.expect_seq - 1
        if head and (int(head["seq"]), str(head["hash"])) != (last_seq, checker.prev):
            hseq = int(head["seq"])
            problem = (
                f"record {last_seq + 1}..{hseq} at the end is missing (deleted)"
                if hseq > last_seq
                else f"the chain head recorded at write time (record {hseq}) does not match the last record"
            )
            return VerifyResult(
                False, checker.checked, first, last_seq, bad_seq=min(hseq, last_seq + 1), problem=problem, anchor=anchor
            )
        return VerifyResult(True, checker.checked, first, last_seq, checker.prev, anchor=anchor)
    finally:
        con.close()


def _verify_archive_into(path: Path, checker: ChainChecker) -> VerifyResult | None:
    header: dict[str, Any] | None = None
    with path.open() as fh:
        for n, line in enumerate(fh):
            doc = json.loads(line)
            if n == 0:
                header = doc
                if doc.get("type") != "pvegate-audit-archive":
                    return VerifyResult(False, checker.checked, problem=f"{path} is not a pvegate audit archive")
                if checker.checked == 0 and checker.expect_seq == 1:  # the first archive sets the start
                    checker.expect_seq = int(doc["anchor"]["seq"]) + 1
                    checker.prev = str(doc["anchor"]["hash"])
                continue
            if not checker.feed(doc):
                return VerifyResult(
                    False, checker.checked, bad_seq=checker.bad_seq, problem=f"{path}: {checker.problem}"
                )
    if header is None:
        return VerifyResult(False, checker.checked, problem=f"{path} is empty")
    if (checker.expect_seq - 1, checker.prev) != (int(header["last"]["seq"]), str(header["last"]["hash"])):
        return VerifyResult(False, checker.checked, problem=f"{path}: records do not end where its header says")
    return None


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

    def sql(self) -> tuple[str, list[Any]]:
        where, args = [], []
        for col in ("principal", "tool", "target", "outcome", "kind", "request_id"):
            value = getattr(self, col)
            if value is None:
                continue
            if "*" in value:  # shell-style glob, e.g. --target 'default/qemu/*'
                where.append(f"{col} GLOB ?")
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
        sql = "SELECT * FROM audit" + (" WHERE " + " AND ".join(where) if where else "")  # noqa: S608
        sql += " ORDER BY seq DESC" if self.newest_first else " ORDER BY seq"
        if self.limit is not None:
            sql += " LIMIT ?"
            args.append(int(self.limit))
        return sql, args


def search(path: Path, q: Query) -> list[dict[str, Any]]:
    con = connect(path, readonly=True)
    try:
        sql, args = q.sql()
        rows = [dict(r) for r in con.execute(sql, args)]
    finally:
        con.close()
    return list(reversed(rows)) if q.newest_first else rows


def iter_rows(path: Path, q: Query) -> Iterator[dict[str, Any]]:
    con = connect(path, readonly=True)
    try:
        sql, args = q.sql()
        for r in con.execute(sql, args):
            yield dict(r)
    finally:
        con.close()


def export_line(row: dict[str, Any]) -> str:
    """One JSONL line: the row with its body as an object; hashes kept so a SIEM can re-verify."""
    doc = dict(row)
    doc["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(row["ts"])) + f".{int(row['ts'] % 1 * 1e6):06d}Z"
    doc["body"] = json.loads(row["body"])
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


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


def archive(path: Path, before: float, out_dir: Path) -> ArchiveResult:
    """Move records older than `before` to a JSONL file and delete them, keeping the chain verifiable.

    The file starts with a header naming the anchor it continues from and the last
    record it holds; the database records that last record as its new anchor. It
    all happens in one write transaction, after the file is fsynced: a crash leaves
    either the old state or the new one.
    """
    con = connect(path)
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            anchor = _meta(con, "anchor") or {"seq": 0, "hash": GENESIS}
            cut = con.execute("SELECT MAX(seq) FROM audit WHERE ts < ?", (before,)).fetchone()[0]
            if cut is None:
                con.execute("ROLLBACK")
                return ArchiveResult(None, 0)
            rows = [dict(r) for r in con.execute("SELECT * FROM audit WHERE seq <= ? ORDER BY seq", (cut,))]
            checker = ChainChecker(int(anchor["seq"]), str(anchor["hash"]))
            for row in rows:
                if not checker.feed(row):  # never archive (and so launder) a broken chain
                    raise ValueError(f"refusing to archive: {checker.problem}")
            last = {"seq": rows[-1]["seq"], "hash": rows[-1]["hash"]}
            out_dir.mkdir(parents=True, exist_ok=True)
            name = f"audit-{rows[0]['seq']:012d}-{last['seq']:012d}.jsonl"
            final = out_dir / name
            tmp = out_dir / (name + ".tmp")
            header = {
                "type": "pvegate-audit-archive",
                "format": 1,
                "created_at": time.time(),
                "anchor": anchor,
                "first": {"seq": rows[0]["seq"], "hash": rows[0]["hash"]},
                "last": last,
                "count": len(rows),
            }
            digest = hashlib.sha256()
            with tmp.open("w") as fh:
                for text in [json.dumps(header, separators=(",", ":"))] + [_archive_line(r) for r in rows]:
                    fh.write(text + "\n")
                    digest.update((text + "\n").encode())
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(final)
            _fsync_dir(out_dir)
            archives = _meta(con, "archives") or []
            archives.append({"file": str(final), "sha256": digest.hexdigest(), **header})
            con.execute("DELETE FROM audit WHERE seq <= ?", (cut,))
            for key, value in (("anchor", last), ("archives", archives)):
                con.execute(
                    "INSERT INTO audit_meta(key, value) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, json.dumps(value)),
                )
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return ArchiveResult(final, len(rows), rows[0]["seq"], last["seq"], last["hash"])
    finally:
        con.close()


def archives(path: Path) -> list[dict[str, Any]]:
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
    refs += [r for r in (config.auth.hs256_secret, config.admin.token) if r is not None]
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
