"""The SQLite audit's lock file (store/backend.py hold_sqlite_audit): the gateway writes its pid into
it, often as root, so a link planted in the audit's directory must not make it write another file.
Found in review: `<audit>.lock` as a symlink had its target truncated and overwritten."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.store.backend import AuditInUse, hold_sqlite_audit


def _config(audit: Path) -> Any:
    return SimpleNamespace(storage=SimpleNamespace(postgresql=False), audit_path=audit)


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "audit.db.lock").symlink_to(victim)
    with pytest.raises(OSError):
        hold_sqlite_audit(_config(tmp_path / "audit.db"))
    assert victim.read_text() == "precious\n"


def test_a_hard_linked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.link(victim, tmp_path / "audit.db.lock")
    with pytest.raises(OSError, match="regular file of its own"):
        hold_sqlite_audit(_config(tmp_path / "audit.db"))
    assert victim.read_text() == "precious\n"


def test_the_lock_is_taken_once_and_given_back(tmp_path: Path) -> None:
    config = _config(tmp_path / "audit.db")
    held = hold_sqlite_audit(config)
    assert held is not None
    try:
        with pytest.raises(AuditInUse, match=rf"pid {os.getpid()}"):
            hold_sqlite_audit(config)  # flock is per open file: a second open in this process is refused too
    finally:
        held.close()
    again = hold_sqlite_audit(config)
    assert again is not None
    again.close()
