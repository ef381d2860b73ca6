"""The PostgreSQL test harness: a real server on loopback, and none left behind when pytest dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

from tests.pgserver import PostgresServer

REPO = Path(__file__).resolve().parents[2]


async def test_server_answers_on_loopback(postgres: PostgresServer) -> None:
    conn = await asyncpg.connect(postgres.dsn)
    try:
        assert str(await conn.fetchval("SELECT inet_server_addr()")) == "127.0.0.1"
        assert int(await conn.fetchval("SHOW server_version_num")) >= 150000
    finally:
        await conn.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_killed_test_process_leaves_no_server(tmp_path: Path) -> None:
    """SIGKILL the process that started a server: the kernel's parent-death signal stops it."""
    script = (
        "import os, signal\n"
        "from tests.pgserver import start_postgres\n"
        "s = start_postgres()\n"
        "print(s.proc.pid, s.root, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=90, check=False
    )
    assert run.returncode == -9, run.stderr
    pid_text, root = run.stdout.split()
    pid = int(pid_text)
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(pid), f"postmaster {pid} outlived its killed parent"
    finally:
        if _alive(pid):
            os.kill(pid, 9)
        subprocess.run(["rm", "-rf", root], check=False)
