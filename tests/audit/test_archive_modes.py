"""What `pvegate audit archive` and `pvegate audit export --out` write holds what the database holds
(principals, arguments, decisions): like the database (0600 whatever the umask, deployment.md), the
files are 0600 and a directory the archive makes is 0700, under the usual umask 022 too."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.store import audit as auditlib
from tests.config.conftest import minimal, run_pvegate, write
from tests.support import filled_audit


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # inherited by the `pvegate` subprocesses too
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_archive_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    asyncio.run(filled_audit(db))
    out = tmp_path / "new" / "audit-archive"
    res = auditlib.archive(db, time.time() + 1, out)
    assert res.file is not None and res.count == 5
    assert _mode(out) == 0o700
    assert _mode(res.file) == 0o600
    assert auditlib.verify(db, [res.file]).ok


def test_a_crashed_archive_s_leftover_is_replaced(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    asyncio.run(filled_audit(db))
    out = tmp_path / "arch"
    out.mkdir()
    (out / "audit-000000000001-000000000005.jsonl.tmp").write_text("half an archive")
    res = auditlib.archive(db, time.time() + 1, out)
    assert res.file is not None and _mode(res.file) == 0o600
    assert auditlib.verify(db, [res.file]).ok
    assert not list(out.glob("*.tmp"))


def _config(tmp_path: Path) -> Path:
    cfg = write(tmp_path, minimal(tmp_path))
    asyncio.run(filled_audit(tmp_path / "state" / "audit.db"))
    return cfg


def test_cli_archive_and_export_files_are_private(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    exported = tmp_path / "export.jsonl"
    r = run_pvegate("audit", "export", "-c", str(cfg), "--jsonl", "--out", str(exported), timeout=30)
    assert r.returncode == 0, r.stderr
    assert _mode(exported) == 0o600
    assert len(exported.read_text().splitlines()) == 5
    r = run_pvegate("audit", "archive", "-c", str(cfg), "--older-than", "0s", timeout=30)
    assert r.returncode == 0, r.stderr
    arch = tmp_path / "state" / "audit-archive"
    assert _mode(arch) == 0o700
    (file,) = arch.glob("audit-*.jsonl")
    assert _mode(file) == 0o600


@pytest.mark.skipif(sys.platform != "linux", reason="modes as Linux reports them")
def test_an_existing_export_file_is_replaced_by_a_private_one(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    exported = tmp_path / "export.jsonl"
    exported.write_text("old\n")
    exported.chmod(0o644)
    r = run_pvegate("audit", "export", "-c", str(cfg), "--jsonl", "--out", str(exported), timeout=30)
    assert r.returncode == 0, r.stderr
    assert _mode(exported) == 0o600 and "old" not in exported.read_text()
