"""The audit store under test, shared by the storage suite's audit tests: a SQLite file or a real
PostgreSQL database (tests/pgserver.py), its head key, and raw SQL on it (the tamperer's hand)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from gateway.store import audit as auditlib
from gateway.store.approvals import ApprovalStore
from gateway.store.audit import AuditLog, AuditRecord, sign_fresh
from gateway.store.audit_seal import HeadKey
from gateway.store.db import PostgresDatabase
from gateway.store.pgsync import PgLocation
from gateway.store.schema import upgrade_all
from tests.config.conftest import minimal, write
from tests.pgserver import PostgresServer
from tests.support import sqlite_exec


async def new_pg_database(server: PostgresServer, prefix: str = "a_", key: Path | None = None) -> str:
    """A new, upgraded database on the server: its URL. With `key`, the audit head key is made there too
    (when missing) and signs the new chain's mark: what `pvegate db upgrade` leaves, which a replica opens."""
    url = await server.create_database(prefix)
    db = PostgresDatabase(url)
    await db.open()
    try:
        await upgrade_all(db)
        if key is not None:
            await sign_fresh(db, HeadKey.load_or_create(key)[0])
    finally:
        await db.close()
    return url


@contextlib.asynccontextmanager
async def approval_replicas(dsn: str) -> AsyncIterator[tuple[ApprovalStore, ApprovalStore]]:
    """Two approval stores on one PostgreSQL database: two replicas' views of the approvals."""
    a, b = ApprovalStore(PostgresDatabase(dsn)), ApprovalStore(PostgresDatabase(dsn))
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def sign_new_chain(url: str, key: Path) -> None:
    """`pvegate db upgrade`'s last step, for a test that made the key afterwards: sign the chain's mark."""
    db = PostgresDatabase(url)
    await db.open()
    try:
        await sign_fresh(db, HeadKey.load(key))
    finally:
        await db.close()


class AuditClock:
    """audit.py's `time` with time() set by the test (`AuditClock.install(monkeypatch)`): the records' ts, which
    the chain covers, so a test cannot change them after they are written."""

    def __init__(self) -> None:
        self.now = time.time()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def time(self) -> float:
        return self.now

    @classmethod
    def install(cls, monkeypatch: Any) -> AuditClock:
        clock = cls()
        monkeypatch.setattr(auditlib, "time", clock)
        return clock


OPEN_TARGET = {"cluster": "default", "kind": "qemu", "node": "pve1", "vmid": 100}


async def write_settled(log: AuditLog, request_id: str, vmid: int, task: str | None = None) -> None:
    """A call allowed and settled (`start_vm` on guest `vmid`); with `task`, its dispatch and result name
    the UPID, as a call that started a task records its claim on it."""
    body = {"task_id": task} if task else {}
    steps = [("received", None, {}), ("decision", "allow", {})]
    steps += [("dispatch", None, body)] if task else []
    for kind, outcome, rec in [*steps, ("result", "ok", body)]:
        await log.append(AuditRecord(request_id, kind, "alice", "start_vm", f"default/qemu/{vmid}", outcome, rec))


async def write_open_call(log: AuditLog, request_id: str) -> None:
    """A call allowed and never settled (`start_vm` on OPEN_TARGET): what reconciliation settles."""
    received = {"target": OPEN_TARGET, "arguments": {"vmid": 100}, "effect": "mutate", "dry_run": False}
    await log.append(AuditRecord(request_id, "received", "alice", "start_vm", "default/qemu/100", None, received))
    await log.append(AuditRecord(request_id, "decision", "alice", "start_vm", "default/qemu/100", "allow", {}))


def off(fn: Any, *args: Any, **kw: Any) -> Any:
    """A blocking call (the operator side) made from an async test: in a thread that runs no event loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(fn, *args, **kw).result()


@dataclass
class Store:
    """One audit store under test: where it is, its head key, and raw SQL on it (the tamperer's hand)."""

    backend: str
    where: Path | PgLocation
    key: Path
    root: Path

    def log(self, **kw: Any) -> AuditLog:
        return AuditLog(self.where, head_key=self.key, **kw)

    def sql(self, *stmts: str) -> None:
        if isinstance(self.where, Path):
            sqlite_exec(self.where, *stmts)
            return

        async def run() -> None:
            assert isinstance(self.where, PgLocation)
            con = await asyncpg.connect(self.where.url)
            try:
                for s in stmts:
                    await con.execute(s)
            finally:
                await con.close()

        off(asyncio.run, run())

    def value(self, query: str) -> Any:
        """The first column of the first row of a query."""
        if isinstance(self.where, Path):
            con = sqlite3.connect(self.where)
            try:
                return con.execute(query).fetchone()[0]
            finally:
                con.close()

        async def run() -> Any:
            assert isinstance(self.where, PgLocation)
            con = await asyncpg.connect(self.where.url)
            try:
                return await con.fetchval(query)
            finally:
                await con.close()

        return off(asyncio.run, run())

    def config(self) -> Path:
        """A gateway configuration naming this store (for the CLI)."""
        raw = minimal(self.root)
        raw["audit"] = {**raw.get("audit", {}), "head_key_file": str(self.key)}
        if isinstance(self.where, PgLocation):
            raw["storage"] = {"url": self.where.url}
        else:
            raw["storage"] = {"url": f"sqlite://{self.where}"}
            raw.get("audit", {}).pop("path", None)
        return write(self.root, raw)
