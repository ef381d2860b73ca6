"""A gateway killed without clean-up leaves its managed OPA running; the next one stops it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gateway.policy.opa_sidecar import OPASidecar

LAUNCHER = """
import sys, time
from pathlib import Path
from gateway.policy.opa_sidecar import OPASidecar
opa = OPASidecar(policies=(Path("policies"),), pid_file=Path(sys.argv[1]), decision_logs=False)
opa.start()
print(opa.process.pid, flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_a_new_sidecar_reaps_the_opa_of_a_killed_gateway(tmp_path: Path) -> None:
    pid_file = tmp_path / "opa.pid"
    root = Path(__file__).resolve().parents[2]
    gw = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pid_file)], stdout=subprocess.PIPE, text=True, cwd=root)
    assert gw.stdout is not None
    left_behind = int(gw.stdout.readline())
    gw.send_signal(signal.SIGKILL)  # no clean-up runs
    gw.wait()
    assert _running(left_behind)
    fresh = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
    try:
        fresh.start()
        deadline = time.monotonic() + 10
        while _running(left_behind) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(left_behind), "the orphaned OPA is still running"
        assert fresh.alive()
    finally:
        fresh.stop()
        if _running(left_behind):
            os.kill(left_behind, signal.SIGKILL)


def test_a_live_siblings_opa_is_left_alone(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    pid_file = tmp_path / "opa.pid"
    first = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
    second = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
    first.start()
    try:
        second.start()  # same state dir, same (living) process: not an orphan
        assert first.alive() and second.alive()
    finally:
        second.stop()
        first.stop()


def test_a_second_process_neither_takes_nor_removes_a_live_gateways_pid_file(tmp_path: Path) -> None:
    pid_file = tmp_path / "opa.pid"
    root = Path(__file__).resolve().parents[2]
    gw = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pid_file)], stdout=subprocess.PIPE, text=True, cwd=root)
    assert gw.stdout is not None
    try:
        gateway_opa = int(gw.stdout.readline())
        recorded = pid_file.read_text()
        assert recorded.split() == [str(gateway_opa), str(gw.pid)]
        other = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
        other.start()
        try:
            assert pid_file.read_text() == recorded  # not taken over
        finally:
            other.stop()
        assert pid_file.read_text() == recorded  # not removed
        assert _running(gateway_opa)
    finally:
        gw.send_signal(signal.SIGTERM)
        gw.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(gateway_opa, signal.SIGKILL)
