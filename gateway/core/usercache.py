"""The user's cache directory for pvegate's derived files (OPA builds, checked connector files).

Used only when this user owns it and nobody else may write to it: a file there is trusted as
the result of work done before (a policy built, a schema found valid), so a directory others
could write would be a way to plant one."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
from pathlib import Path


def _trusted_chain(real: Path) -> bool:
    """No other user can rename, replace or remove anything on the way to `real` (a path without
    symlinks): every directory from / down is root's or this user's, and none is writable by
    others unless sticky (/tmp: others may add entries there, not move ours). Otherwise another
    user could swap pvegate/ for their own between the check and the read."""
    uid = os.getuid()
    for d in (real, *real.parents):
        st = os.stat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, 0):
            return False
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return False
    return True


def _own_dir(d: Path) -> bool:
    """`d` made mode 0700 when missing (whatever the umask), and then a directory of this user's,
    not a symlink, that nobody else may write to."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    st = os.lstat(d)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def private_dir(name: str) -> Path | None:
    """$XDG_CACHE_HOME/pvegate/<name> (~/.cache when unset), or None when it cannot be made or
    is not this user's alone: pvegate/ and <name> are made 0700, are this user's and writable by
    no one else, and no other user can move any directory above them (_trusted_chain). The path
    returned has no symlinks in it. A relative $XDG_CACHE_HOME is ignored, as the XDG spec says,
    and without a home directory (a service user with none: `~` stays `~`) there is no cache:
    never a folder relative to the working one."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(xdg) if os.path.isabs(xdg) else Path(os.path.expanduser("~")) / ".cache"
    if not root.is_absolute():
        return None
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        real = Path(os.path.realpath(root))
        if not _trusted_chain(real):
            return None
        base = real / "pvegate"
        if not _own_dir(base) or not _own_dir(base / name):
            return None
        return base / name
    except OSError:
        return None


READ_LIMIT = 8 << 20  # a cache file larger than this is not read: none is near it


def read_text(path: Path, limit: int = READ_LIMIT) -> str | None:
    """The text of a regular file of this user's, at most `limit` bytes, or None: never follows a
    symlink, never blocks on a FIFO or a device, never raises."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
        return raw.decode() if len(raw) <= limit else None
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


class KeptDigests:
    """SHA-256 digests of inputs a deterministic check found valid, kept in one file of the private
    cache directory so that the next process skips the check (only valid verdicts: an input found
    wrong is checked, and refused, every time). Not a directory of this user's alone: nothing is
    read or written, every input is checked."""

    def __init__(self, dirname: str, filename: str, keep: int = 20_000) -> None:
        self.dirname, self.filename, self.keep = dirname, filename, keep
        self._lock = threading.Lock()
        self._known: frozenset[str] | None = None
        self._new: set[str] = set()

    def _file(self) -> Path | None:
        d = private_dir(self.dirname)
        return None if d is None else d / self.filename

    def _read(self) -> frozenset[str]:
        if self._known is None:
            f = self._file()
            text = read_text(f) if f is not None else None
            self._known = frozenset(line for line in (text or "").split() if len(line) == 64)
        return self._known

    def __contains__(self, digest: str) -> bool:
        return digest in self._new or digest in self._read()

    def add(self, digest: str) -> None:
        self._new.add(digest)

    def save(self) -> None:
        """Write the digests added beside those read (write_atomically); past `keep` the file starts
        afresh."""
        with self._lock:
            if not self._new or (f := self._file()) is None:
                return
            known = self._read()
            keep = known | self._new if len(known) + len(self._new) <= self.keep else frozenset(self._new)
            self._known, self._new = frozenset(keep), set()
            write_atomically(f, "\n".join(sorted(keep)) + "\n")


def write_atomically(path: Path, text: str) -> None:
    """`text` as the file's whole content (mode 0600), or the file unchanged: a reader sees the
    old file or the new one. A cache that cannot be written costs the work it would have saved."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def digest(*parts: str | bytes) -> str:
    """SHA-256 of the parts, each length-prefixed (no two lists of parts share a digest)."""
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "big") + b)
    return h.hexdigest()
