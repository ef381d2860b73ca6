"""Servers the dev harness starts as child processes (Keycloak here; the tests' PostgreSQL): a
free loopback port to start them on, and no orphans when the process that started them dies."""

from __future__ import annotations

import ctypes
import signal
import socket
from collections.abc import Callable

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
