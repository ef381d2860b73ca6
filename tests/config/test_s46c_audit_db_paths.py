"""The audit commands given a directory as the audit database.

`audit tail|search|export --db DIR` said `error: cannot read the audit: disk I/O error`, `db status` and
`db upgrade` on an `audit.path` that is a directory `the SQLite file: disk I/O error` (or `unable to open
database file`), `audit checkpoint|archive --db DIR` blamed a missing head key, and `audit verify --db DIR`
`FAILED: there is no audit database at DIR`. Now each says the path is a directory, not an audit
database, with its command's status for an audit it cannot read: exit 1 (EXIT_STATUS). For `verify`
that stays a finding, FAILED, exit 1, like a database file that is not there (tests/config/
test_cli_errors.py, "tamper-relevant"): a deleted or replaced database is never "cannot check" (2).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.config.conftest import run_pvegate, write

DIR_SAID = "is a directory, not an audit database"


@pytest.mark.parametrize(
    "command", [("audit", "tail"), ("audit", "search"), ("audit", "export", "--jsonl")], ids=lambda c: c[1]
)
def test_a_reader_given_a_directory_says_so(tmp_path: Path, command: tuple[str, ...]) -> None:
    r = run_pvegate(*command, "--db", str(tmp_path))
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == f"error: cannot read the audit: {tmp_path} {DIR_SAID}\n", r.stderr


@pytest.mark.parametrize(
    ("command", "said"),
    [(("audit", "checkpoint"), "error: no checkpoint: "), (("audit", "archive", "--older-than", "1d"), "error: ")],
    ids=["checkpoint", "archive"],
)
def test_a_writer_given_a_directory_says_so(tmp_path: Path, command: tuple[str, ...], said: str) -> None:
    r = run_pvegate(*command, "--db", str(tmp_path))
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == f"{said}{tmp_path} {DIR_SAID}\n", r.stderr


def test_verify_given_a_directory_fails_saying_so(tmp_path: Path) -> None:
    r = run_pvegate("audit", "verify", "--db", str(tmp_path))
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr == f"FAILED: {tmp_path} {DIR_SAID}\n(0 records verified before it)\n", r.stderr


def test_verify_json_given_a_directory(tmp_path: Path) -> None:
    r = run_pvegate("audit", "verify", "--db", str(tmp_path), "--json")
    assert r.returncode == 1 and f'"problem": "{tmp_path} {DIR_SAID}"' in r.stdout and r.stderr == "", r


@pytest.mark.parametrize("command", ["status", "upgrade"])
def test_db_commands_on_a_directory_say_so(base: dict[str, Any], tmp_path: Path, command: str) -> None:
    (tmp_path / "adir").mkdir()
    base["audit"] = {"path": str(tmp_path / "adir")}
    r = run_pvegate("db", command, "--config", str(write(tmp_path, base)))
    assert r.returncode == 1, r
    assert r.stderr == f"error: {tmp_path / 'adir'} {DIR_SAID} (audit.path)\n", r.stderr
    assert list((tmp_path / "adir").iterdir()) == []


@pytest.fixture
def sealed(base: dict[str, Any], tmp_path: Path) -> Path:
    """A real, sealed SQLite audit (and its head key next to it), made by `db upgrade`."""
    base["audit"] = {"path": str(tmp_path / "audit.db")}
    made = run_pvegate("db", "upgrade", "--config", str(write(tmp_path, base)))
    assert made.returncode == 0, made.stderr
    return tmp_path / "audit.db"


def test_a_database_replaced_by_a_directory_is_a_failure(sealed: Path) -> None:
    assert run_pvegate("audit", "verify", "--db", str(sealed)).returncode == 0
    sealed.unlink()
    sealed.mkdir()
    r = run_pvegate("audit", "verify", "--db", str(sealed))
    assert r.returncode == 1 and r.stderr.startswith(f"FAILED: {sealed} {DIR_SAID}"), r


def test_a_deleted_or_emptied_database_is_still_a_failure(sealed: Path) -> None:
    with sqlite3.connect(sealed) as con:
        con.execute("DELETE FROM audit_meta")
    r = run_pvegate("audit", "verify", "--db", str(sealed))
    assert r.returncode == 1 and r.stderr.startswith("FAILED"), r
    sealed.unlink()
    r = run_pvegate("audit", "verify", "--db", str(sealed))
    assert r.returncode == 1 and r.stderr.startswith(f"FAILED: there is no audit database at {sealed}"), r
