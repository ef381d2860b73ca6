"""The sidecar's supervision and its clean-up after a killed gateway, against a real OPA.

Two defects:

- `supervise()` retried only OPAUnavailable. Any other failure of a restart (an OSError: the opa
  binary caught mid-upgrade, a full disk while the config is written, a policy file unreadable)
  ended the supervising task for good: OPA stayed down and every call was denied until the gateway
  itself was restarted, while the promise is that a dead OPA is restarted with backoff.
- `reap_stale()` stopped whatever `opa ... --server` process had the pid the pid file records. A
  pid outlives its process in the state dir (a gateway killed, the host rebooted) and may since be
  another gateway's OPA: starting this gateway killed it, denying every call of that gateway. The
  record names the socket its OPA listened on (a directory of random name); only a process
  listening there is the one to stop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar

POLICIES = (REPO_ROOT / "policies",)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _swap(binary: Path, content: bytes) -> None:
    """Replace the binary as an upgrade does (a new file renamed over it: a running OPA keeps its own)."""
    new = binary.with_name("opa.new")
    new.write_bytes(content)
    new.chmod(0o755)
    os.replace(new, binary)


def test_supervise_restarts_opa_after_a_restart_failed_with_an_os_error(tmp_path: Path) -> None:
    binary = tmp_path / "opa"
    shutil.copy2(REPO_ROOT / ".tools" / "bin" / "opa", binary)
    good = binary.read_bytes()
    sidecar = OPASidecar(policies=POLICIES, binary=binary)
    sidecar.start()

    async def scenario() -> tuple[bool, bool]:
        task = asyncio.create_task(sidecar.supervise(max_backoff=0.5))
        try:
            await asyncio.sleep(0.2)
            _swap(binary, b"\0an opa binary half copied")  # exec fails: OSError (ENOEXEC)
            assert sidecar.process is not None
            os.kill(sidecar.process.pid, signal.SIGKILL)
            await asyncio.sleep(1.5)  # restarts fail meanwhile
            _swap(binary, good)  # the upgrade completes
            for _ in range(200):
                await asyncio.sleep(0.1)
                if sidecar.alive() or task.done():
                    break
            return task.done(), sidecar.alive()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    try:
        ended, alive = asyncio.run(scenario())
    finally:
        sidecar.stop()
    assert not ended, "a restart failing with an OSError ended OPA's supervision for good"
    assert alive, "OPA was not restarted once its binary could run again"


def test_reap_stale_leaves_another_gateways_opa_with_a_reused_pid_alone(tmp_path: Path) -> None:
    other = OPASidecar(policies=POLICIES)  # another gateway's OPA, on another state dir
    other.start()
    fresh = OPASidecar(policies=POLICIES, pid_file=tmp_path / "opa.pid")
    try:
        assert other.process is not None
        # a record from before a reboot whose OPA pid is now the other gateway's OPA
        stale_socket_dir = Path(tempfile.mkdtemp(prefix="pvegate-opa-", dir=tmp_path))
        (tmp_path / "opa.pid").write_text(f"{other.process.pid} {_dead_pid()} {stale_socket_dir}\n")
        fresh.start()
        assert fresh.alive()
        assert other.alive(), "starting killed another gateway's OPA whose pid a stale record named"
        assert not stale_socket_dir.exists()  # the record's own leftovers still go
    finally:
        fresh.stop()
        other.stop()


def test_reap_stale_still_stops_the_recorded_opa(tmp_path: Path) -> None:
    killed = OPASidecar(policies=POLICIES, pid_file=tmp_path / "opa.pid")
    killed.start()
    assert killed.process is not None
    left = killed.process
    # the gateway is killed: its record now names a gateway that is gone
    pid, _, *dirs = (tmp_path / "opa.pid").read_text().split()
    (tmp_path / "opa.pid").write_text(" ".join([pid, str(_dead_pid()), *dirs]) + "\n")
    fresh = OPASidecar(policies=POLICIES, pid_file=tmp_path / "opa.pid")
    try:
        fresh.start()
        assert left.wait(timeout=10) is not None, "the OPA of the killed gateway was left running"
        assert fresh.alive()
    finally:
        fresh.stop()
        killed.process = left
        killed.stop()
