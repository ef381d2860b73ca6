"""`pvegate audit export -o FILE` where FILE cannot be written: said as a write problem.

It said `error: cannot read the audit: [Errno 2] No such file or directory: '/nowhere/.x.jsonl.partial'`:
the audit read fine; the output could not be written, and the name shown was a temporary file the
operator never gave. Now: `error: cannot write FILE: why; nothing was written`, exit 1, no file left
behind; an audit that cannot be read is still said as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.config.conftest import run_pvegate, write


@pytest.fixture
def config(base: dict[str, Any], tmp_path: Path) -> Path:
    path = write(tmp_path, base)
    made = run_pvegate("db", "upgrade", "--config", str(path))  # a real, sealed SQLite audit
    assert made.returncode == 0, made.stderr
    return path


def test_an_output_in_a_missing_directory_is_a_write_error(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "nowhere" / "audit.jsonl"
    r = run_pvegate("audit", "export", "--config", str(config), "--jsonl", "-o", str(out))
    assert r.returncode == 1, r
    assert r.stderr == f"error: cannot write {out}: No such file or directory; nothing was written\n", r.stderr
    assert not (tmp_path / "nowhere").exists()


def test_an_output_that_is_a_directory_is_a_write_error(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "exports"
    out.mkdir()
    r = run_pvegate("audit", "export", "--config", str(config), "--jsonl", "-o", str(out))
    assert r.returncode == 1, r
    assert r.stderr == f"error: cannot write {out}: Is a directory; nothing was written\n", r.stderr
    assert list(tmp_path.glob(".*partial")) == [] and list(out.iterdir()) == []


def test_an_audit_that_cannot_be_read_is_still_said_so(base: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, base)  # no `db upgrade`: no audit database
    out = tmp_path / "audit.jsonl"
    r = run_pvegate("audit", "export", "--config", str(path), "--jsonl", "-o", str(out))
    assert r.returncode == 1 and r.stderr.startswith("error: cannot read the audit: no audit database at"), r.stderr
    assert not out.exists() and list(tmp_path.glob(".*partial")) == []


def test_a_good_output_is_written(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    r = run_pvegate("audit", "export", "--config", str(config), "--jsonl", "-o", str(out))
    assert r.returncode == 0 and r.stderr == "exported 0 records\n" and out.read_text() == "", r
