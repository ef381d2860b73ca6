"""`make demo ONESHOT=1` is half of the README's contract: run it as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import free_port


def test_demo_oneshot_behaves(tmp_path: Path) -> None:
    env = {**os.environ, "PVEGATE_DEMO_DIR": str(tmp_path / "demo")}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "demo", "--oneshot", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "demo: all steps behaved" in out
    assert out.count(": OK") >= 9, out[-4000:]
    assert "Traceback" not in out
