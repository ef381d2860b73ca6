"""The audit log: an append-only, hash-chained record of every call, in SQLite (WAL).

Each record carries the hash of its predecessor, so an edited, deleted or
reordered row breaks the chain. One writer task serialises all appends; a
decision record is committed before the connector runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

GENESIS = "0" * 64

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
"""


def record_hash(prev: str, seq: int, ts: float, request_id: str, kind: str, body: str) -> str:
    h = hashlib.sha256()
    for part in (prev, str(seq), repr(ts), request_id, kind, body):
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()


@dataclass(frozen=True)
class AuditRecord:
    request_id: str
    kind: str  # received | decision | result | auth_failure | refusal
    principal: str | None = None
    tool: str | None = None
    target: str | None = None
    outcome: str | None = None
    body: dict[str, Any] | None = None


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self._last_hash = GENESIS
        self._last_seq = 0

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute("PRAGMA synchronous=NORMAL")
        await self._db.executescript(SCHEMA)
        await self._db.commit()
        async with self._db.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1") as cur:
            row = await cur.fetchone()
        if row:
            self._last_seq, self._last_hash = int(row[0]), str(row[1])

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def append(self, *records: AuditRecord) -> None:
        """Append records in one transaction; returns only once they are committed."""
        assert self._db is not None, "audit log not open"
        async with self._lock:
            seq, prev = self._last_seq, self._last_hash
            rows = []
            for rec in records:
                seq += 1
                ts = time.time()
                body = json.dumps(rec.body or {}, sort_keys=True, separators=(",", ":"), default=str)
                digest = record_hash(prev, seq, ts, rec.request_id, rec.kind, body)
                rows.append(
                    (
                        seq,
                        ts,
                        rec.request_id,
                        rec.kind,
                        rec.principal,
                        rec.tool,
                        rec.target,
                        rec.outcome,
                        body,
                        prev,
                        digest,
                    )
                )
                prev = digest
            await self._db.executemany("INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
            await self._db.commit()
            self._last_seq, self._last_hash = seq, prev

    async def rows(self, request_id: str | None = None) -> list[dict[str, Any]]:
        assert self._db is not None
        sql = "SELECT seq, ts, request_id, kind, principal, tool, target, outcome, body FROM audit"
        args: tuple[Any, ...] = ()
        if request_id:
            sql += " WHERE request_id = ?"
            args = (request_id,)
        async with self._db.execute(sql + " ORDER BY seq", args) as cur:
            out = []
            async for r in cur:
                out.append(
                    {
                        "seq": r[0],
                        "ts": r[1],
                        "request_id": r[2],
                        "kind": r[3],
                        "principal": r[4],
                        "tool": r[5],
                        "target": r[6],
                        "outcome": r[7],
                        "body": json.loads(r[8]),
                    }
                )
            return out
