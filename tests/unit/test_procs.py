"""Child servers of the dev harness and the tests: started again on another port when someone took
theirs first, any other failure reported with the log's tail, and stopped with a grace period."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.core import processes
from gateway.dev.procs import StartFailed, start_on_free_port


def _python(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args])


def test_a_server_that_lost_its_port_is_started_again_on_another(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    ports: list[int] = []

    def spawn(port: int) -> subprocess.Popen[bytes]:
        ports.append(port)
        if len(ports) == 1:  # someone took the port: the server says so and exits
            return _python(
                "import sys; open(sys.argv[1], 'a').write('bind: Address already in use'); sys.exit(1)", str(log)
            )
        return _python("import time; time.sleep(60)")

    port, proc = start_on_free_port(
        "server",
        spawn,
        lambda p: len(ports) == 2 and p == ports[1],
        lambda: log.read_text() if log.exists() else "",
        attempts=3,
        timeout=10,
        poll=0.05,
        bind_errors=("Address already in use",),
    )
    try:
        assert len(ports) == 2 and port == ports[1] and proc.poll() is None
    finally:
        processes.stop(proc, grace=5)
    assert proc.returncode is not None


def test_any_other_failure_is_reported_with_the_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(StartFailed, match=r"(?s)server did not start within 5s:.*bad setting"):
        start_on_free_port(
            "server",
            lambda _p: _python("import sys; open(sys.argv[1], 'a').write('FATAL: bad setting'); sys.exit(1)", str(log)),
            lambda _p: False,
            lambda: log.read_text() if log.exists() else "",
            attempts=3,
            timeout=5,
            poll=0.05,
            bind_errors=("Address already in use",),
        )


def test_a_child_that_ignores_the_signal_is_killed_after_the_grace_period() -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # its handler is in place
    t0 = time.monotonic()
    processes.stop(proc, grace=1)
    assert proc.returncode == -9 and 0.9 < time.monotonic() - t0 < 10
    proc.stdout.close()
    processes.stop(proc, grace=1)  # already gone: nothing to do
