"""Operator-side edge cases of the SQLite audit: a path with `#` or `?` in it, a garbled schema version, a
database another process holds locked, an absurd `-n`, and a trigger added to the audit table."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.cli import main as cli
from gateway.core.config import load
from gateway.store import audit as auditlib
from gateway.store.audit import AuditIntegrityError, AuditLog, AuditRecord
from gateway.store.audit_seal import HeadKey
from tests.config.conftest import minimal, run_pvegate, write
from tests.store.test_db_commands import one_line_error


async def _filled(db: Path, key: Path | None = None) -> None:
    log = AuditLog(db, head_key=key) if key is not None else AuditLog(db)
    await log.open()
    try:
        await log.append(
            *(AuditRecord(f"r{i}", "decision", "agent", "list_nodes", "default", "deny", {}) for i in range(3))
        )
    finally:
        await log.close()


async def test_a_path_with_hash_or_question_mark_is_read_as_itself(tmp_path: Path) -> None:
    d = tmp_path / "odd#dir?x=1"
    d.mkdir()
    db = d / "audit.db"
    await _filled(db)
    assert len(auditlib.search(db, auditlib.Query())) == 3
    assert auditlib.verify(db).ok
    assert not (tmp_path / "odd").exists()  # no database made at the path cut at `#`


async def test_a_garbled_schema_version_is_one_line_for_db_status_and_upgrade(tmp_path: Path) -> None:
    cfg_file = write(tmp_path, minimal(tmp_path))
    cfg = load(cfg_file)
    r = await asyncio.to_thread(run_pvegate, "db", "upgrade", "--config", str(cfg_file))
    assert r.returncode == 0, r.stdout + r.stderr
    con = sqlite3.connect(cfg.audit_path)
    con.execute("UPDATE pvegate_schema SET version = 'two' WHERE component = 'audit'")
    con.commit()
    con.close()
    for command in ("status", "upgrade"):
        r = await asyncio.to_thread(run_pvegate, "db", command, "--config", str(cfg_file))
        assert "schema version" in one_line_error(r) and "'two'" in r.stderr, (command, r.stderr)


async def test_verify_on_a_locked_database_is_an_operational_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "audit.db"
    await _filled(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")  # held until ROLLBACK; in exclusive mode the lock outlives it
        capsys.readouterr()
        assert cli(["audit", "verify", "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: cannot verify:") and "locked" in err and "Traceback" not in err, err
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert cli(["audit", "verify", "--db", str(db)]) == 0


async def test_a_huge_count_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "audit.db"
    await _filled(db)
    for args in (["tail", "-n", str(2**64)], ["search", "--limit", str(2**64)]):
        with pytest.raises(SystemExit) as exc:
            cli(["audit", *args, "--db", str(db)])
        assert exc.value.code == 2, args
        err = capsys.readouterr().err
        assert "must be at most" in err and "Traceback" not in err, err


async def test_a_trigger_added_to_the_audit_table_is_refused_at_start(tmp_path: Path) -> None:
    db, key = tmp_path / "audit.db", tmp_path / "audit-head.key"
    HeadKey.create(key)
    await _filled(db, key)
    con = sqlite3.connect(db)
    con.execute("CREATE TRIGGER scrub AFTER INSERT ON audit BEGIN UPDATE audit SET principal = 'x'; END")
    con.commit()
    con.close()
    log = AuditLog(db, head_key=key)
    with pytest.raises(AuditIntegrityError, match="trigger 'scrub'"):
        await log.open()
    await log.close()
