"""`pvegate audit export --jsonl -o .` (or `-o /`): a traceback (`ValueError: PosixPath('.') has an empty
name`, from naming the temporary file beside the output), exit 1 from the interpreter, not a sentence. An
output that is a directory is now said before the audit is read, as any other directory was: `error: cannot
write DIR: Is a directory; nothing was written`, exit 1, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.config.conftest import REPO_ROOT, minimal, run_pvegate, write


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = write(tmp_path, minimal(tmp_path))
    made = run_pvegate("db", "upgrade", "--config", str(path))  # a real, sealed SQLite audit
    assert made.returncode == 0, made.stderr
    return path


@pytest.mark.parametrize("out", [".", "/", os.path.relpath("/", REPO_ROOT)])
def test_an_output_named_by_a_directory_alone_is_a_write_error(config: Path, out: str) -> None:
    before = sorted(os.listdir(REPO_ROOT))  # run_pvegate runs in the repository: `.` is it
    r = run_pvegate("audit", "export", "--config", str(config), "--jsonl", "-o", out)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r
    assert r.stderr == f"error: cannot write {out}: Is a directory; nothing was written\n", r.stderr
    assert sorted(os.listdir(REPO_ROOT)) == before
