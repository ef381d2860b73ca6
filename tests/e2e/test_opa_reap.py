"""A gateway killed without clean-up leaves its managed OPA running (or, if OPA was killed too, its
socket's directory) and OPA's private config directory; the next one on the same state dir clears them
up (tests/policy/test_opa_reap_config_dir.py: which config directories it does and does not remove)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.opa_sidecar import OPASidecar

LAUNCHER = """
import sys, time
from pathlib import Path
from gateway.policy.opa_sidecar import OPASidecar
opa = OPASidecar(policies=(Path("policies"),), pid_file=Path(sys.argv[1]), decision_logs=False)
opa.start()
print(opa.process.pid, opa.socket_dir, flush=True)
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
    pid, old_dir = gw.stdout.readline().split()
    left_behind = int(pid)
    gw.send_signal(signal.SIGKILL)  # no clean-up runs
    gw.wait()
    assert _running(left_behind) and Path(old_dir).is_dir()
    old_config = Path(pid_file.read_text().split()[3])  # it can hold credentials: recorded to be removed
    assert (old_config / "opa-config.json").is_file()
    fresh = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
    try:
        fresh.start()
        deadline = time.monotonic() + 10
        while _running(left_behind) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(left_behind), "the orphaned OPA is still running"
        assert fresh.alive()
        assert not Path(old_dir).exists(), "the orphaned OPA's socket directory is left behind"
        assert not old_config.exists(), "the orphaned OPA's config directory is left behind"
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
        pid, gateway_dir = gw.stdout.readline().split()
        gateway_opa = int(pid)
        recorded = pid_file.read_text()
        assert recorded.split()[:3] == [str(gateway_opa), str(gw.pid), gateway_dir]
        gateway_config = Path(recorded.split()[3])
        assert (gateway_config / "opa-config.json").is_file()
        other = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
        other.start()
        try:
            assert pid_file.read_text() == recorded  # not taken over
        finally:
            other.stop()
        assert pid_file.read_text() == recorded  # not removed
        assert _running(gateway_opa) and Path(gateway_dir).is_dir()
    finally:
        gw.send_signal(signal.SIGTERM)
        gw.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(gateway_opa, signal.SIGKILL)
        # what the next gateway on this state dir would clear up
        OPASidecar(pid_file=pid_file).reap_stale()
        assert not Path(gateway_dir).exists()
        assert not gateway_config.exists()


def test_the_socket_directory_of_an_opa_killed_with_its_gateway_is_removed(tmp_path: Path) -> None:
    """A crash that takes OPA down too (SIGKILL to both) leaves a stale socket in its directory under
    /tmp; the next gateway on the same state dir removes that directory, not someone else's."""
    pid_file = tmp_path / "opa.pid"
    root = Path(__file__).resolve().parents[2]
    gw = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(pid_file)], stdout=subprocess.PIPE, text=True, cwd=root)
    assert gw.stdout is not None
    pid, old_dir = gw.stdout.readline().split()
    gw.send_signal(signal.SIGKILL)
    gw.wait()
    os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _running(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (Path(old_dir) / "opa.sock").exists()  # OPA had no chance to remove it
    foreign = tmp_path / "pvegate-opa-not-ours"  # a record naming a directory that is a link: left alone
    foreign.symlink_to(tmp_path)
    fresh = OPASidecar(policies=(root / "policies",), pid_file=pid_file, decision_logs=False)
    try:
        fresh.start()
        assert not Path(old_dir).exists()
        assert pid_file.read_text().split()[2] == str(fresh.socket_dir)
    finally:
        fresh.stop()
    pid_file.write_text(f"{pid} {gw.pid} {foreign}\n")
    OPASidecar(pid_file=pid_file).reap_stale()
    assert foreign.is_symlink() and tmp_path.is_dir()


def test_a_start_that_fails_before_opa_runs_leaves_no_directory(tmp_path: Path, monkeypatch: Any) -> None:
    """No opa binary, a policy tree that cannot be read: the private config and socket directories
    made for the start are removed, not left in $TMPDIR one per attempt."""
    from gateway.policy.opa_sidecar import OPAUnavailable

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # mkdtemp reads $TMPDIR afresh
    try:
        missing = OPASidecar(policies=(Path("policies"),), binary=tmp_path / "no-opa", decision_logs=False)
        with pytest.raises(OPAUnavailable):
            missing.start(timeout=5)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("pvegate-opa-")] == []
        gone = OPASidecar(policies=(tmp_path / "no-such-policies",), decision_logs=False)
        with pytest.raises(Exception):  # whatever the failure, nothing stays behind
            gone.start(timeout=5)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith("pvegate-opa-")] == []
    finally:
        tempfile.tempdir = None
