"""The sample audit the replay tests read: written once per run by the real audit writer
(bench/replay_audit.py: decisions by the real OPA on the repository's policy), read only."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit import export_line


@pytest.fixture(scope="package")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("recorded") / "audit.db"
    subprocess.run(
        [sys.executable, "bench/replay_audit.py", "--calls", "60", "--db", str(db)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return db


def decisions(db: Path) -> list[dict[str, Any]]:
    """The audit's decision records, in order, as stored."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM audit WHERE kind = 'decision' ORDER BY seq")]
    finally:
        con.close()


def replayable(db: Path) -> list[dict[str, Any]]:
    """The decision records a replay asks the candidate about: with their kept input, not failed closed."""
    return [r for r in decisions(db) if '"input_z"' in r["body"] and '"failed_closed": true' not in r["body"]]


def export_rows(db: Path) -> list[dict[str, Any]]:
    """The replayable decision lines of the sample audit, as `pvegate audit export --jsonl` writes them."""
    lines = [json.loads(export_line(r)) for r in replayable(db)]
    assert len(lines) > 10
    return lines
