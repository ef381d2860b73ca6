"""Servers the dev harness starts as child processes (Keycloak here; the tests' PostgreSQL): a
free loopback port to start them on, again on another when someone took it first, and no
orphans when the process that started them dies."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child only calls into it


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A `preexec_fn` giving the child `sig` when its parent dies, even by SIGKILL. Popen calls it
    after its user/group switch, which would clear the setting if it were made before."""

    def set_parent_death_signal() -> None:  # only a prctl between fork and exec
        _LIBC.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return set_parent_death_signal


def spawn_logged(
    argv: list[str], *, log: Path, cwd: Path, env: dict[str, str], death_signal: signal.Signals, **kw: Any
) -> subprocess.Popen[bytes]:
    """A server process appending its output to `log`, stdin closed, given `death_signal` when this
    process dies (Popen's user/group arguments pass through in `kw`)."""
    with open(log, "ab") as fh:  # the server keeps its own copy of the descriptor
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=fh,
            preexec_fn=die_with_parent(death_signal),
            **kw,
        )


class StartFailed(Exception):
    """The server exited or did not get ready in time (the message ends with its log's tail)."""


def start_on_free_port(
    what: str,
    spawn: Callable[[int], subprocess.Popen[bytes]],
    ready: Callable[[int], bool],
    log: Callable[[], str],
    *,
    attempts: int,
    timeout: float,
    poll: float,
    bind_errors: tuple[str, ...],
) -> tuple[int, subprocess.Popen[bytes]]:
    """(port, process) of a server spawned on a free loopback port once `ready(port)`. Another
    process may take the port between the probe and the server's bind: when its log names one of
    `bind_errors`, it is tried again on another port; any other failure is StartFailed."""
    for _attempt in range(attempts):
        port = free_loopback_port()
        proc = spawn(port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if ready(port):
                return port, proc
            time.sleep(poll)
        text = log()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if any(e in text for e in bind_errors):
            continue
        raise StartFailed(f"{what} did not start within {timeout:.0f}s:\n{text[-3000:]}")
    raise StartFailed(f"{what} could not bind a free loopback port in {attempts} attempts")
