"""`pvegate stdio` as a real subprocess for the tests: its stdin and stdout pipes the test's, the OPA
sidecar it starts tracked and killed at the end (the `stdio` fixture, tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.outcomes.helpers import REPO, posts

LOCAL = {"desk-agent": {"kind": "agent", "roles": ["operator"]}}
PVEGATE = [sys.executable, "-m", "gateway.cli", "stdio"]
BOUND = 40.0  # seconds: every stop below ends well within this, or the test fails (no hang)
STOP_PATH = "/qemu/103/status/stop"


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rpc(id_: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}}


INITIALIZE = rpc(1, "initialize", {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "signals", "version": "1"},
})  # fmt: skip


@contextlib.contextmanager
def on_a_socket(env: DevEnv, root: Path) -> Iterator[tuple[subprocess.Popen[bytes], socket.socket, Path]]:
    """`pvegate stdio` whose stdin and stdout are one socket (socat's EXEC:, inetd, systemd Accept=yes).

    Yields the process, the test's end of the socket (60 s timeout) and the stderr file; the socket
    is closed and the process killed at the end, whatever the test did."""
    mine, theirs = socket.socketpair()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    environ["TMPDIR"] = str(root)
    environ["PATH"] = f"{REPO / '.tools' / 'bin'}:{environ.get('PATH', '')}"
    err_path = root / "stdio.err"
    with err_path.open("wb") as err:
        proc = subprocess.Popen(
            [*PVEGATE, "--config", str(env.config_path), "--principal", "desk-agent"],
            stdin=theirs,
            stdout=theirs,
            stderr=err,
            cwd=REPO,
            env=environ,
        )
    theirs.close()
    try:
        mine.settimeout(60)
        yield proc, mine, err_path
    finally:
        mine.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Stdio:
    """One `pvegate stdio` process: its stdin and stdout pipes are the test's, its $TMPDIR private
    (OPA's directories land there), stderr in a file."""

    def __init__(self, env: DevEnv, root: Path) -> None:
        self.env = env
        self.stderr_path = root / f"stdio-{time.monotonic_ns()}.err"
        self.tmpdir = Path(tempfile.mkdtemp(prefix="pvgt-"))  # short: OPA's socket path must fit
        self.proc: subprocess.Popen[bytes] | None = None
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.opa_pids: set[int] = set()

    def start(self, reader: bool = True) -> Stdio:
        """`reader`: stdout read in a thread (replies queued); else the test reads it itself."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
        environ["TMPDIR"] = str(self.tmpdir)
        environ["PATH"] = f"{REPO / '.tools' / 'bin'}:{environ.get('PATH', '')}"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [*PVEGATE, "--config", str(self.env.config_path), "--principal", "desk-agent"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=REPO,
                env=environ,
            )
        if reader:
            threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        return self

    def _read(self, out: IO[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in out:
                self.replies.put(json.loads(line))
        self.replies.put(None)  # end of output

    def send(self, doc: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(doc).encode() + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 60.0) -> dict[str, Any] | None:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no reply within {timeout}s; stderr: {self.stderr()[-3000:]}")

    def ready(self) -> Stdio:
        """Initialized (the start-up is done: OPA runs, the audit is open)."""
        self.send(INITIALIZE)
        got = self.reply()
        assert got is not None and got["result"]["serverInfo"]["name"] == "pvegate", got
        self.opa_pid()
        return self

    def opa_pid(self) -> int | None:
        try:
            pid = int((self.env.config.state_dir / "opa.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        self.opa_pids.add(pid)
        return pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = BOUND) -> tuple[int, float]:
        """(exit status, seconds taken); the test fails if it does not exit within `timeout`."""
        assert self.proc is not None
        started = time.monotonic()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pvegate stdio did not exit within {timeout}s; stderr: {self.stderr()[-3000:]}")
        return self.proc.returncode, time.monotonic() - started

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def assert_no_opa_left(self) -> None:
        deadline = time.monotonic() + 5  # a process just stopped may take a moment to be reaped
        while any(running(p) for p in self.opa_pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.opa_pids, "OPA's pid was never seen"
        assert not [p for p in self.opa_pids if running(p)], "OPA outlived pvegate stdio"
        left = sorted(p.name for p in self.tmpdir.iterdir() if p.name.startswith("pvegate-opa-"))
        assert left == [], f"OPA's directories left behind: {left}"

    def cleanup(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    if stream is not None:
                        stream.close()
        self.opa_pid()
        for pid in self.opa_pids:
            if running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def wait_until(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def stop_sent(sim: Any) -> None:
    """Returns once Proxmox (the simulator) has received the vm_stop: the call is in flight."""
    wait_until(lambda: posts(sim, STOP_PATH), 30, "Proxmox to receive the vm_stop")
