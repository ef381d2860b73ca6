"""Integrity-protected opaque tokens the client echoes back to us.

Two uses, one key, a purpose-tagged JSON payload (HMAC-SHA256 signed, or AES-GCM encrypted):
- `requestState` of a 2026-07-28 `input_required` result: bound to the
  principal and the request digest (tool + canonical arguments), short-lived and
  single-use, so a client cannot forge, replay, transplant or reuse it.
- the legacy-era `Mcp-Session-Id`: remembers what the client declared at
  `initialize` (e.g. URL elicitation) without server-side session storage. It is a
  header, so proxies and logs record it: its payload (the principal's issuer and subject
  among it) is encrypted (AES-GCM, `Sealer.encrypt`), not only signed.

The key is the same in every replica (`state_key`, or one created in the database:
store/shared_keys.py), so a retry may reach any of them; `Sealer()` without a key
(stdio: one process) makes a random one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.core.principal import Principal
from gateway.store.handoffs import SharedStates


class StateError(Exception):
    """The echoed token is malformed, forged, expired, foreign or already used."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_NONCE_BYTES = 12  # AES-GCM's standard nonce, random per token (NIST SP 800-38D: up to 2^32 per key)
_TOKEN_MAX = 4096


def principal_key(p: Principal) -> str:
    return f"{p.iss}\x1f{p.sub}"


@dataclass(frozen=True)
class ApprovalState:
    """What a verified requestState tells us: which approval request this retry is about."""

    approval_id: str
    request_digest: str
    nonce: str


class Sealer:
    """HMAC-SHA256 sealing with a purpose tag, so a session id can never pass as a requestState; and
    AES-GCM encryption (same purpose tag as associated data) for what must not be readable either.

    The AES key is derived from the one shared key (HKDF, its own label), so every replica that can
    verify can decrypt, rotation stays one key, and the HMAC key is never used as a cipher key."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"pvegate/aead/v1")
        self._aead = AESGCM(hkdf.derive(self._key))

    def seal(self, purpose: str, payload: dict[str, Any]) -> str:
        body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        mac = hmac.new(self._key, f"{purpose}.{body}".encode(), hashlib.sha256).digest()
        return f"{body}.{_b64(mac)}"

    def unseal(self, purpose: str, token: Any) -> dict[str, Any]:
        if not isinstance(token, str) or token.count(".") != 1 or len(token) > 4096:
            raise StateError("malformed")
        body, mac = token.split(".")
        want = hmac.new(self._key, f"{purpose}.{body}".encode(), hashlib.sha256).digest()
        try:
            if not hmac.compare_digest(_unb64(mac), want):
                raise StateError("bad signature")
            payload = json.loads(_unb64(body))
        except (ValueError, TypeError) as exc:
            raise StateError("malformed") from exc
        if not isinstance(payload, dict):
            raise StateError("malformed")
        return payload

    def encrypt(self, purpose: str, payload: dict[str, Any]) -> str:
        """An opaque token (base64url, no dot): nothing of `payload` can be read without the key."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        plain = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return _b64(nonce + self._aead.encrypt(nonce, plain, purpose.encode()))

    def decrypt(self, purpose: str, token: Any) -> dict[str, Any]:
        """The payload of a token `encrypt` made for `purpose`; StateError for anything else (a token
        sealed with `seal`, changed, cut, of another purpose or under another key)."""
        if not isinstance(token, str) or len(token) > _TOKEN_MAX or "." in token:
            raise StateError("malformed")
        try:
            raw = _unb64(token)
            if len(raw) <= _NONCE_BYTES:
                raise StateError("malformed")
            plain = self._aead.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], purpose.encode())
            payload = json.loads(plain)
        except InvalidTag as exc:
            raise StateError("bad tag") from exc
        except (ValueError, TypeError) as exc:  # bad base64 (binascii.Error), bad JSON or UTF-8
            raise StateError("malformed") from exc
        if not isinstance(payload, dict):
            raise StateError("malformed")
        return payload


class RequestStates:
    """Mints and redeems single-use approval requestStates.

    With `shared` (the gateway: the database storage.url names) a nonce is used once across
    every replica and a legacy handoff is found by whichever replica the retry reaches;
    without (`pvegate stdio`: one process) both are kept in this process."""

    PURPOSE = "pvegate/request-state/v1"

    def __init__(self, sealer: Sealer, ttl_seconds: float = 600.0, shared: SharedStates | None = None) -> None:
        self.sealer = sealer
        self.ttl = ttl_seconds
        self.shared = shared
        self._used: dict[str, float] = {}  # nonce -> expiry; pruned as they lapse
        self._handoffs: dict[tuple[str, str], tuple[str, float]] = {}  # legacy era, see remember()

    def mint(self, principal: Principal, request_digest: str, approval_id: str) -> str:
        return self.sealer.seal(
            self.PURPOSE,
            {
                "p": principal_key(principal),
                "d": request_digest,
                "a": approval_id,
                "exp": time.time() + self.ttl,
                "n": secrets.token_hex(16),
            },
        )

    async def redeem(self, token: Any, principal: Principal, request_digest: str) -> ApprovalState:
        """Verify and consume; any mismatch raises StateError (and the token stays unusable)."""
        payload = self.sealer.unseal(self.PURPOSE, token)
        now = time.time()
        exp = payload.get("exp")
        if not isinstance(exp, (int, float)) or exp < now:
            raise StateError("expired")
        if payload.get("p") != principal_key(principal):
            raise StateError("issued to another principal")
        if payload.get("d") != request_digest:
            raise StateError("issued for a different tool call (name or arguments changed)")
        nonce = payload.get("n")
        if not isinstance(nonce, str) or not isinstance(payload.get("a"), str):
            raise StateError("malformed")
        if self.shared is not None:
            if not await self.shared.use_once(nonce, float(exp)):  # its expiry is checked there too
                raise StateError("already used, or expired by the database's clock")
            return ApprovalState(payload["a"], request_digest, nonce)
        self._prune(now)
        if nonce in self._used:
            raise StateError("already used")
        self._used[nonce] = float(exp)
        return ApprovalState(payload["a"], request_digest, nonce)

    async def give_back(self, state: ApprovalState) -> None:
        """The retry `state` was redeemed for sent nothing and gave its approval back (pipeline
        `_unspent`): its requestState may be presented again, as a token may (docs/approvals.md).
        Only called once the approval is usable again; consuming it is still the store's one
        conditional update, so the call still runs at most once."""
        if self.shared is not None:
            await self.shared.unuse(state.nonce)
            return
        self._used.pop(state.nonce, None)

    def _prune(self, now: float) -> None:
        if len(self._used) > 1024:
            for n in [n for n, e in self._used.items() if e < now]:
                del self._used[n]

    # 2025-11-25 has no requestState: the client retries the identical call after the URL
    # elicitation. The same binding (principal + request digest, short-lived, single-use)
    # is then held here instead of in the client's hands.
    async def remember(self, principal: Principal, request_digest: str, approval_id: str) -> None:
        if self.shared is not None:
            await self.shared.remember(principal_key(principal), request_digest, approval_id, self.ttl)
            return
        now = time.time()
        if len(self._handoffs) > 4096:
            for k in [k for k, (_, e) in self._handoffs.items() if e < now]:
                del self._handoffs[k]
        self._handoffs[(principal_key(principal), request_digest)] = (approval_id, now + self.ttl)

    async def recall(self, principal: Principal, request_digest: str) -> str | None:
        if self.shared is not None:
            return await self.shared.recall(principal_key(principal), request_digest)
        entry = self._handoffs.pop((principal_key(principal), request_digest), None)
        if entry is None or entry[1] < time.time():
            return None
        return entry[0]


class Sessions:
    """Legacy-era session ids: an encrypted record of the client's declared capabilities.

    v1 ids (signed, readable: they showed the principal) are no longer taken: one presented after the
    upgrade is no session (a plain pending result, as for a client that declared nothing)."""

    PURPOSE = "pvegate/session/v2"

    def __init__(self, sealer: Sealer, ttl_seconds: float = 86400.0) -> None:
        self.sealer = sealer
        self.ttl = ttl_seconds

    def mint(self, principal: Principal, version: str, url_elicitation: bool) -> str:
        # no nonce field: encrypt's random nonce already makes each id distinct
        return self.sealer.encrypt(
            self.PURPOSE,
            {"p": principal_key(principal), "v": version, "eu": url_elicitation, "exp": time.time() + self.ttl},
        )

    def url_elicitation(self, token: str | None, principal: Principal) -> bool:
        """Did this principal's client declare URL elicitation? Any doubt says no (plain result)."""
        if not token:
            return False
        try:
            payload = self.sealer.decrypt(self.PURPOSE, token)
        except StateError:
            return False
        exp = payload.get("exp")
        return (
            isinstance(exp, (int, float))
            and exp > time.time()
            and payload.get("p") == principal_key(principal)
            and payload.get("eu") is True
        )
