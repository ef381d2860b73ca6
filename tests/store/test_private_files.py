"""The SQLite stores' files are their owner's alone (0600), whatever the umask: the audit and the
approval requests hold principals, the arguments of calls and decisions. SQLite gives a database's
-wal and -shm files the database file's own mode, so creating it 0600 covers all three."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.db import SqliteDatabase


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the usual default: files 0644 unless made otherwise
    yield
    os.umask(old)


def modes(path: Path) -> dict[str, int]:
    return {
        p.name: stat.S_IMODE(p.stat().st_mode)
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
        if p.exists()
    }


async def test_the_audit_database_and_its_wal_are_the_owners_alone(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "state" / "audit.db"
    log = AuditLog(path, head_key=tmp_path / "state" / "audit.key")
    await log.open()
    try:
        await log.append(AuditRecord("r1", "decision", "agent", "list_nodes", None, "allow", {"x": 1}))
        seen = modes(path)
    finally:
        await log.close()
    assert seen.keys() >= {"audit.db", "audit.db-wal"} and set(seen.values()) == {0o600}, seen


async def test_a_store_database_is_the_owners_alone_and_an_existing_one_keeps_its_mode(
    tmp_path: Path, open_umask: None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "approvals.db"
    db = SqliteDatabase(path)
    await db.open()
    try:
        async with db.transaction() as tx:
            await tx.execute("CREATE TABLE t (x INTEGER)")
            await tx.execute("INSERT INTO t VALUES (1)")
        seen = modes(path)
    finally:
        await db.close()
    assert set(seen.values()) == {0o600}, seen

    kept = tmp_path / "shared.db"
    kept.touch(mode=0o640)  # an operator's choice (a group that reads it) is theirs
    kept.chmod(0o640)
    db = SqliteDatabase(kept)
    await db.open()
    await db.close()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert "readable by every user" not in caplog.text

    old = tmp_path / "older.db"  # an older release's, world-readable: said at start, left as it is
    old.touch(mode=0o644)
    old.chmod(0o644)
    db = SqliteDatabase(old)
    await db.open()
    await db.close()
    assert stat.S_IMODE(old.stat().st_mode) == 0o644
    assert f"{old} is readable by every user of this host: chmod 600 it" in caplog.text
