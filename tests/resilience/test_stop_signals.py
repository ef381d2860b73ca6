"""`pvegate serve` (a subprocess, real OPA) stopped while it starts, or failing to start after OPA runs:
it exits, in bounded time, with its one-line reason, and leaves no OPA behind (OPA runs in its own
session: only the gateway stops it). SIGHUP while serving drains and stops, as SIGTERM does.

Before: a start-up failure inside the application's lifespan (a console.session_key too short,
say) printed uvicorn's traceback and then hung for ever (the audit store's thread was never
closed) with OPA running; SIGTERM/SIGINT/SIGHUP during the start-up, or SIGHUP at any time, killed
the gateway by Python's default action, OPA orphaned with its directories under $TMPDIR.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from tests.config.conftest import PVEGATE, minimal, write
from tests.support import free_port

PREFIX = "pvegate: cannot start: "
BOUND = 30.0  # seconds: every run below ends well within this, or the test fails (no hang)


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split()[2] != "Z"
    except OSError:
        return False


class Serve:
    """`pvegate serve` on a config under `root`, its $TMPDIR private (OPA's directories land there)."""

    def __init__(self, root: Path, raw: dict[str, Any]) -> None:
        self.root = root
        self.state = root / "state"
        self.port = int(raw["listen"]["port"])
        self.config = write(root, raw)
        self.tmpdir = Path(tempfile.mkdtemp(prefix="pvgt-"))  # short: OPA's socket path must fit
        self.proc: subprocess.Popen[str] | None = None
        self.opa_pids: set[int] = set()

    def start(self) -> Serve:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
        env["TMPDIR"] = str(self.tmpdir)
        self.proc = subprocess.Popen(
            [*PVEGATE, "serve", "--config", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=env,
        )
        return self

    def opa_pid(self) -> int | None:
        try:
            pid = int((self.state / "opa.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        self.opa_pids.add(pid)
        return pid

    def wait_for_opa(self, timeout: float = 60.0) -> int:
        """OPA's pid once it runs (the gateway recorded it), while the gateway still starts."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            pid = self.opa_pid()
            if pid is not None and _running(pid):
                return pid
            assert time.monotonic() < deadline, "OPA did not start"
            time.sleep(0.02)

    def wait_serving(self, timeout: float = 60.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/livez", timeout=2).status_code == 200:
                    return
            assert time.monotonic() < deadline, "the gateway did not serve"
            time.sleep(0.1)

    def finish(self, timeout: float = BOUND) -> tuple[int, str, float]:
        """(exit status, stderr, seconds taken); the test fails if it does not exit within `timeout`."""
        assert self.proc is not None
        started = time.monotonic()
        try:
            _, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pvegate serve did not exit within {timeout}s")
        return self.proc.returncode, stderr, time.monotonic() - started

    def assert_nothing_left(self) -> None:
        """No OPA running from this gateway, no pid file, no OPA directory in its $TMPDIR."""
        self.opa_pid()
        deadline = time.monotonic() + 5  # a process just killed may take a moment to be reaped
        while any(_running(p) for p in self.opa_pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in self.opa_pids if _running(p)], "OPA outlived its gateway"
        assert not (self.state / "opa.pid").exists(), "opa.pid left behind"
        left = sorted(p.name for p in self.tmpdir.iterdir() if p.name.startswith("pvegate-opa-"))
        assert left == [], f"OPA's directories left behind: {left}"

    def cleanup(self) -> None:
        """Whatever the test's outcome: this test's processes gone, its $TMPDIR removed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        self.opa_pid()
        for pid in self.opa_pids:
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    made: list[Serve] = []

    def make(raw: dict[str, Any]) -> Serve:
        made.append(Serve(tmp_path, raw))
        return made[-1]

    yield make
    for s in made:
        s.cleanup()


def _base(root: Path) -> dict[str, Any]:
    raw = minimal(root)
    raw["listen"]["port"] = free_port()
    return raw


def _refusal(status: int, stderr: str) -> str:
    assert status == 2, (status, stderr)
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(PREFIX), stderr
    return last.removeprefix(PREFIX)


# --- a start-up failure after OPA started --------------------------------------------------------


@pytest.mark.parametrize("key", ["short", "missing"])
def test_a_bad_console_session_key_is_refused_before_anything_starts(tmp_path: Path, serve: Any, key: str) -> None:
    """Preflight reads console.session_key (and client_secret) too: one line naming it, exit 2, no OPA."""
    raw = _base(tmp_path)
    key_file = tmp_path / "secrets" / "console-key"
    if key == "short":
        key_file.write_text("short\n")
    raw["public_url"] = "https://gw.example.net"
    raw["console"] = {
        "enabled": True,
        "issuer": "https://idp.example.net/realms/x",
        "client_id": "pvegate-console",
        "session_key": {"file": str(key_file)},
    }
    gw = serve(raw).start()
    status, stderr, _ = gw.finish()
    reason = _refusal(status, stderr)
    assert reason.startswith("console.session_key"), reason
    assert ("at least 32 characters" if key == "short" else "cannot read secret file") in reason, reason
    assert not (gw.state / "opa.log").exists(), "OPA was started before the refusal"
    gw.assert_nothing_left()


def test_a_failure_in_the_start_up_after_the_build_exits_and_stops_opa(tmp_path: Path, serve: Any) -> None:
    """The request-state key's table at a schema version newer than this pvegate knows: refused in the
    start-up that follows the build (OPA running, the audit open). One line and exit 2, OPA stopped,
    the audit store closed (its thread kept the process from ever exiting)."""
    from gateway.store.audit import AuditLog, AuditRecord

    db = tmp_path / "state" / "audit.db"

    async def sealed() -> None:
        log = AuditLog(db)
        await log.open()
        await log.append(AuditRecord("r1", "decision", outcome="allow"))
        await log.close()

    asyncio.run(sealed())
    con = sqlite3.connect(db)
    con.execute("INSERT INTO pvegate_schema (component, version) VALUES ('keys', 99)")
    con.commit()
    con.close()
    gw = serve(_base(tmp_path)).start()
    status, stderr, _ = gw.finish()
    reason = _refusal(status, stderr)
    assert "the keys schema in the database is version 99" in reason, reason
    assert (gw.state / "opa.log").exists(), "OPA never started: not the case under test"
    gw.assert_nothing_left()


# --- signals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_while_opa_starts_stops_the_start_up_cleanly(tmp_path: Path, serve: Any, sig: signal.Signals) -> None:
    """OPA follows a bundle service that never answers: it runs (its pid recorded) but the start waits for
    the bundle (up to 20 s). The signal then ends the start-up at once: OPA stopped, one line, exit 2."""
    raw = _base(tmp_path)
    raw["opa"] = {
        "services": {"nowhere": {"url": f"http://127.0.0.1:{free_port()}"}},
        "bundles": {"policy": {"service": "nowhere", "resource": "bundle.tar.gz"}},
        "allow_unsigned": True,
    }
    gw = serve(raw).start()
    gw.wait_for_opa()
    time.sleep(0.3)  # well inside the wait for OPA to be ready
    assert gw.proc.poll() is None
    gw.proc.send_signal(sig)
    status, stderr, took = gw.finish()
    reason = _refusal(status, stderr)
    assert reason.startswith(f"stopped by {sig.name} during start-up"), reason
    assert took < 10, f"took {took:.1f}s to stop"  # not the 20 s OPA's start would have waited
    gw.assert_nothing_left()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sighup_while_serving_drains_and_stops_as_sigterm_does(tmp_path: Path, serve: Any, sig: signal.Signals) -> None:
    """The drain, uvicorn's shutdown, OPA and the stores closed; then stopped by the signal it handled
    (re-raised, as uvicorn does for SIGTERM: a supervisor sees the signal it sent, after a clean stop)."""
    gw = serve(_base(tmp_path)).start()
    gw.wait_serving()
    assert gw.wait_for_opa()
    gw.proc.send_signal(sig)
    status, stderr, _ = gw.finish()
    assert status == -sig, (status, stderr)
    assert "draining: 0 call(s) in flight" in stderr, stderr
    assert "Traceback" not in stderr and PREFIX not in stderr, stderr
    gw.assert_nothing_left()
