"""`pvegate console sign-out --sub SUB` with a SUB that is not UTF-8 in this locale (it arrives with lone
surrogates): a UnicodeEncodeError traceback from the database driver, with or without --force. It is now a
usage error (exit 2, one line naming it, no traceback), as the audit commands' filters are, and nothing is
written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.config.conftest import PVEGATE, REPO_ROOT, minimal, run_pvegate, write


def test_a_subject_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    cfg = write(tmp_path, minimal(tmp_path))
    assert run_pvegate("db", "upgrade", "--config", str(cfg)).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    for force in ([], ["--force"]):
        r = subprocess.run(
            [*PVEGATE, "console", "sign-out", "--config", str(cfg), "--sub", b"al\xffice", *force],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env=env,
            timeout=60,
            check=False,
        )
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 2 and "argument --sub: not UTF-8 text" in r.stderr, r.stderr
    # control: a subject of text is signed out
    r = run_pvegate("console", "sign-out", "--config", str(cfg), "--sub", "alice", "--force")
    assert r.returncode == 0 and "every console session of alice" in r.stdout, r.stderr
