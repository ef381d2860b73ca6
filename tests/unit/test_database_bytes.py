"""Reading a live database's raw bytes (the no-secret tests do) must leave the gateway's SQLite
locks in place: a plain read_bytes() in the gateway's process dropped them, another process's
CLI then deleted the WAL the gateway still wrote to, and 24 tests later failed with "disk I/O error"."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support import database_bytes

# an operator's CLI: opens the database, reads, closes (the last connection out cleans up the WAL)
CLI = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM t').fetchone(); c.close()"


def _after_a_read(db: Path, read: Callable[[Path], bytes]) -> tuple[bool, str]:
    writer = sqlite3.connect(db, isolation_level=None)  # the gateway's writer, open throughout
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("CREATE TABLE t (x TEXT)")
        writer.execute("INSERT INTO t VALUES ('planted-secret')")
        assert b"planted-secret" in read(db)  # the WAL is part of what is searched
        subprocess.run([sys.executable, "-c", CLI, str(db)], check=True, timeout=60)
        wal_kept = db.with_name(db.name + "-wal").exists()
        writer.execute("INSERT INTO t VALUES ('after')")
        reader = sqlite3.connect(db)  # what audit_rows() does
        try:
            return wal_kept, str(reader.execute("SELECT count(*) FROM t").fetchone()[0])
        except sqlite3.OperationalError as exc:
            return wal_kept, str(exc)
        finally:
            reader.close()
    finally:
        writer.close()


def test_database_bytes_keeps_the_writers_locks(tmp_path: Path) -> None:
    assert _after_a_read(tmp_path / "a.db", database_bytes) == (True, "2")


def test_an_in_process_read_is_what_broke_the_database(tmp_path: Path) -> None:
    """The control: the same steps with read_bytes() in this process lose the WAL."""

    def in_process(db: Path) -> bytes:
        return b"".join(p.read_bytes() for p in sorted(db.parent.glob(db.name + "*")))

    assert _after_a_read(tmp_path / "b.db", in_process) == (False, "disk I/O error")
