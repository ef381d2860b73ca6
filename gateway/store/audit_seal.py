"""The audit head key: an HMAC-SHA256 key kept outside the database that authenticates the
chain's head, its creation marker, its archive anchor and archive headers.

The hash chain alone proves order and content only relative to its last record: someone
who can write the database can delete the tail (and the head that names it), or
everything, and what is left still chains. Authenticating the head with a key that is
not in the file makes those edits visible, as long as the key is not also in the hands
of whoever edits the file (see docs/audit.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

KEY_BYTES = 32
KEY_FILE_NAME = "audit-head.key"
# what each MAC is about: a MAC made for one purpose never passes as another
PURPOSES = ("created", "head", "anchor", "archive", "mark", "fresh")
MARK_SUFFIX = ".hwm"  # the high-water mark: next to the key, `audit-head.key.hwm`
MARK_TYPE = "pvegate-audit-high-water"


class AuditKeyError(Exception):
    """The head key is missing, unreadable, garbled or too widely readable (a sentence)."""


def default_key_path(db: Path) -> Path:
    return db.parent / KEY_FILE_NAME


def mark_path(key_path: Path) -> Path:
    """Where the high-water mark of the chains sealed with this key lives: next to the key file."""
    return key_path.with_name(key_path.name + MARK_SUFFIX)


class HeadKey:
    """Signs and checks the chain's authenticated documents (JSON objects with a "mac" member)."""

    def __init__(self, path: Path, secret: bytes) -> None:
        self.path = path
        self._hmac = hmac.new(secret, digestmod=hashlib.sha256)  # keyed once; copied per MAC
        # names the key without revealing it, so verify can say "another key" rather than "tampered"
        self.key_id = hashlib.sha256(b"pvegate-audit-key-id\0" + secret).hexdigest()[:16]

    def __repr__(self) -> str:  # never print key material
        return f"HeadKey(path={self.path}, key_id={self.key_id})"

    @classmethod
    def load(cls, path: Path) -> HeadKey:
        try:
            st = path.stat()
        except FileNotFoundError:
            raise AuditKeyError(f"the audit head key file {path} is missing") from None
        except OSError as exc:
            raise AuditKeyError(f"the audit head key file {path} cannot be read: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise AuditKeyError(f"the audit head key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise AuditKeyError(
                f"the audit head key file {path} is readable or writable by other users "
                f"(mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it"
            )
        try:
            text = path.read_text(encoding="ascii").strip()
            secret = bytes.fromhex(text)
        except (OSError, UnicodeDecodeError, ValueError):
            raise AuditKeyError(f"the audit head key file {path} is not a hex-encoded key") from None
        if len(secret) < KEY_BYTES:
            raise AuditKeyError(f"the audit head key in {path} is too short ({len(secret)} bytes, want {KEY_BYTES})")
        return cls(path, secret)

    @classmethod
    def create(cls, path: Path) -> HeadKey:
        """A new random key, written 0600 without ever replacing an existing file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_bytes(KEY_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, secret.hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):  # the new name durable too (not possible on every platform)
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return cls(path, secret)

    @classmethod
    def load_or_create(cls, path: Path) -> tuple[HeadKey, bool]:
        """(key, created): generates the key only if the file does not exist at all."""
        try:
            return cls.create(path), True
        except FileExistsError:
            return cls.load(path), False

    def _mac_text(self, purpose: str, canonical: str) -> str:
        h = self._hmac.copy()
        h.update(f'["{purpose}",{canonical}]'.encode())  # = canonical JSON of [purpose, body]
        return h.hexdigest()

    def _mac(self, purpose: str, body: dict[str, Any]) -> str:
        return self._mac_text(purpose, json.dumps(body, sort_keys=True, separators=(",", ":")))

    def signed_text(self, purpose: str, doc: dict[str, Any]) -> str:
        """json.dumps(sign(purpose, doc)) in one serialisation (the writer does this on every commit)."""
        assert purpose in PURPOSES and doc and "mac" not in doc
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return f'{canonical[:-1]},"mac":"{self._mac_text(purpose, canonical)}"}}'

    def sign(self, purpose: str, doc: dict[str, Any]) -> dict[str, Any]:
        assert purpose in PURPOSES
        return {**doc, "mac": self._mac(purpose, doc)}

    def check(self, purpose: str, doc: Any) -> bool:
        if not isinstance(doc, dict) or not isinstance(doc.get("mac"), str):
            return False
        body = {k: v for k, v in doc.items() if k != "mac"}
        return hmac.compare_digest(doc["mac"], self._mac(purpose, body))


class MarkError(Exception):
    """The high-water mark file is there but cannot be read, is garbled or is not authenticated (a sentence)."""


def mark_text(path: Path) -> str | MarkError | None:
    """The mark file's text (None: no file), read apart from its check (verify reads it before the database)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return MarkError(f"the high-water mark {path} cannot be read ({getattr(exc, 'strerror', None) or exc})")


def read_mark(path: Path, key: HeadKey, text: str | MarkError | None = None) -> dict[str, Any] | None:
    """The authenticated high-water mark ({"db", "seq", "ts"}, and "hash" when it names the record's hash), None
    when there is no file; MarkError otherwise.

    The mark is the highest record of the chain a writer on this host reached, kept outside the database
    (next to the key), so an older authenticated head put back over a cut end is seen (docs/audit.md), and by
    its hash, a chain cut and then grown past the mark again from that older head (another replica's writes)."""
    if text is None:
        text = mark_text(path)
    if text is None:
        return None
    if isinstance(text, MarkError):
        raise text
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("type") != MARK_TYPE:
        raise MarkError(f"the high-water mark {path} is garbled (not a pvegate high-water mark)")
    # a mark of the release before hashes has none: its MAC covers only these (one with a hash never passes
    # without it, the MAC covering it)
    body = {k: doc.get(k) for k in ("db", "seq", "ts", "mac", *(("hash",) if "hash" in doc else ()))}
    seq = body["seq"]
    if (
        not key.check("mark", body)
        or not isinstance(seq, int)
        or isinstance(seq, bool)
        or seq < 0
        or not isinstance(body.get("hash", ""), str)
    ):
        raise MarkError(
            f"the high-water mark {path} is not authenticated by the audit head key {key.path}: "
            "it was written or changed by another hand, or with another key"
        )
    return body


def write_mark(path: Path, key: HeadKey, db_id: str, seq: int, digest: str | None = None) -> bool:
    """Record that the chain `db_id` reached record `seq` (whose hash is `digest`: a chain cut and grown again
    from an older head has another record there): never lowers a mark already there for it (another
    process on the same chain may have written a higher one). One write and one fsync; the file is
    replaced whole (a temporary file renamed over it), or, where the gateway may not create files in
    the key's directory, rewritten in place (an operator-made file the gateway's user may write).
    False when nothing needed writing; OSError when it cannot be written."""
    with contextlib.suppress(MarkError):
        now = read_mark(path, key)
        if now is not None and now["db"] == db_id and now["seq"] >= seq:
            return False
    body: dict[str, Any] = {"db": db_id, "seq": seq, "ts": time.time()}
    if digest is not None:
        body["hash"] = digest
    doc = key.sign("mark", body)
    data = (json.dumps({"type": MARK_TYPE, **doc}, sort_keys=True) + "\n").encode()
    # a name of this write's own: AuditLogs of one process (its threads) and processes on one host may write
    # the same mark at once, and a shared temporary name let one's rename take the other's half-written file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except PermissionError:  # the directory is not the gateway's to write: the file itself may be
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return True
