"""`pvegate stdio < /dev/null` (a supervisor, nohup, a CI smoke test): stdin is a character device epoll
cannot wait on. It is read in a thread like a regular file, so the end of input ends the server (exit 0),
instead of a traceback logged from an event-loop callback and a process that never exits."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.mcp.stdio import _Lines
from tests.config.conftest import minimal, write

PVEGATE = [sys.executable, "-m", "gateway.cli"]


async def test_dev_null_is_end_of_input_at_once() -> None:
    with open(os.devnull, "rb", buffering=0) as f:
        lines = _Lines(f, 1000)  # type: ignore[arg-type]
        await asyncio.wait_for(lines.open(), 5)
        assert await asyncio.wait_for(lines.next(), 5) is None


def test_pvegate_stdio_with_stdin_at_dev_null_exits_0(tmp_path: Path) -> None:
    raw: dict[str, Any] = minimal(tmp_path)
    raw["local_principals"] = {"bot": {"kind": "agent", "roles": ["operator"]}}
    cfg = write(tmp_path, raw)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    tools = Path(__file__).resolve().parents[2] / ".tools" / "bin"
    env["PATH"] = f"{tools}:{env.get('PATH', '')}"
    with open(os.devnull, "rb") as devnull:
        done = subprocess.run(
            [*PVEGATE, "stdio", "-c", str(cfg), "-p", "bot"],
            stdin=devnull,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
