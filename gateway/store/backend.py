"""Which storage backend `storage.url` selects, and what is not yet shared through PostgreSQL.

Several replicas are only correct if every piece of state a call depends on is shared: the
audit chain, pending approvals and their one-time tokens, the quota counters, and the keys
that seal request states and session ids. Until each is ported (issue #15), a PostgreSQL URL
is refused at start: running with some state per process while the operator believes it
shared would let a token be redeemed twice or a quota be exceeded N-fold.

On SQLite (one host) exactly one gateway process may serve an audit file: each process, as it
starts, takes every call open in the audit for an earlier (crashed) run's and settles it
(store/reconcile.py), so a second process would settle the first one's calls in flight.
`hold_sqlite_audit` enforces that with a lock on `<audit file>.lock`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from gateway.core.config import Config, ConfigError

# What must be shared across replicas and still lives per process or in a local SQLite file.
# Ported (store/db.py): approvals (store/approvals.py), quota counters (store/usage.py), the
# request-state and session signing key (store/shared_keys.py), and the audit log with its head
# key (store/audit.py: one chain, the key file given to every replica). Nothing is left; the check
# stays for whatever state is added next.
NOT_YET_SHARED: tuple[str, ...] = ()


def refuse_unshared(config: Config) -> None:
    """ConfigError (one line) when storage.url selects PostgreSQL before every shared store is ported."""
    if config.storage.postgresql and NOT_YET_SHARED:
        raise ConfigError(
            f"storage.url: PostgreSQL is not supported yet: {', '.join(NOT_YET_SHARED)} would stay per "
            "process, not shared by the replicas (issue #15); leave storage.url unset (SQLite) until then"
        )


class AuditInUse(Exception):
    """Another gateway process serves this SQLite audit; str() is the one-line reason."""


class AuditLock:
    """The exclusive lock on a SQLite audit's lock file, held while its descriptor is open: the
    kernel drops it when the process ends however it ends, so a crashed run never blocks the next."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def lock_path(audit: Path) -> Path:
    """`<audit file>.lock`, next to the real file (symlinks and relative paths resolved: two
    configurations that name the same file by different paths meet on one lock)."""
    real = audit.resolve()
    return real.with_name(real.name + ".lock")


def hold_sqlite_audit(config: Config) -> AuditLock | None:
    """`pvegate serve` and `pvegate stdio` on SQLite: the audit file's lock, taken without waiting;
    AuditInUse when another process holds it, OSError when the lock file cannot be opened. None on
    PostgreSQL, where replicas share the audit (the `audit_replicas` heartbeats). The operator
    commands (audit verify/tail/reconcile, approvals, db upgrade) never take it."""
    if config.storage.postgresql:
        return None
    path = lock_path(config.audit_path)
    # O_CLOEXEC: OPA, which outlives a killed gateway, must not inherit the lock. O_NOFOLLOW and a
    # regular file with one link: the pid is written into it, and a link planted in the directory must
    # not have a gateway (often root) write into another file
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular file of its own (a link?); remove it", str(path))
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise AuditInUse(
            f"audit database {config.audit_path.resolve()}: another pvegate process{holder} is serving this "
            f"audit (it holds {path}); run one gateway process per SQLite audit file, or put the state in "
            "PostgreSQL (storage.url) to run replicas"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):  # who holds it, for the refusal above (the lock is what counts)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return AuditLock(path, fd)


def _holder(fd: int) -> str:
    """` (pid N)` as the holder wrote it, or nothing when it cannot be read."""
    try:
        pid = int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return ""
    return f" (pid {pid})"
