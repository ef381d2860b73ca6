"""A simulator whose launcher dies without stopping it (SIGKILL) does not outlive it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LAUNCHER = """
import json, sys, time
from pathlib import Path
from gateway.sim.harness import start_simulator
h = start_simulator("small", Path(sys.argv[1]), ssh=False)
print(json.dumps({"pid": h.process.pid}), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_simulator_exits_when_its_launcher_is_killed(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert launcher.stdout is not None
    sim_pid = json.loads(launcher.stdout.readline())["pid"]
    assert _alive(sim_pid)
    launcher.send_signal(signal.SIGKILL)  # no finally, no atexit
    launcher.wait()
    deadline = time.monotonic() + 15
    while _alive(sim_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert not _alive(sim_pid), "the simulator outlived its launcher"
    finally:
        if _alive(sim_pid):
            os.killpg(sim_pid, signal.SIGKILL)
