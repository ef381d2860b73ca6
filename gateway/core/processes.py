"""Stopping a child process: ask, wait a grace period, then kill; reaped either way."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def stop(proc: subprocess.Popen[Any] | None, grace: float, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send `sig` (SIGTERM: a clean stop; SIGINT: PostgreSQL's fast shutdown), wait up to `grace`
    seconds, then SIGKILL. Nothing to do for a process already gone."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
