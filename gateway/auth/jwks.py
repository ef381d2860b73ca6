"""Signing keys from an identity provider's JWKS (a URL or a file), cached, rotated by `kid`.

A token naming a `kid` we do not hold triggers at most one refresh per
`min_refresh_seconds` (rotation without restart, no amplification by forged
kids); a failed refresh keeps serving the keys we already trust.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt

log = logging.getLogger("pvegate.jwks")

# Which JWK key types may verify which algorithm: the key decides, never the token header alone.
ALG_KEY_TYPES: dict[str, tuple[str, ...]] = {
    "RS256": ("RSA",),
    "RS384": ("RSA",),
    "RS512": ("RSA",),
    "PS256": ("RSA",),
    "ES256": ("EC",),
    "ES384": ("EC",),
    "EdDSA": ("OKP",),
}


class KeyUnavailable(Exception):
    """No trusted key verifies this token (unknown kid, wrong key type, no keys)."""


@dataclass(frozen=True)
class _Key:
    kid: str | None
    kty: str
    alg: str | None
    key: Any


def _parse(doc: Any) -> list[_Key]:
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError("a JWKS document is an object with a 'keys' array")
    keys: list[_Key] = []
    for raw in doc["keys"]:
        if not isinstance(raw, dict) or raw.get("use", "sig") != "sig":
            continue
        try:
            jwk = jwt.PyJWK.from_dict(raw)
        except jwt.PyJWTError as exc:  # unsupported or broken entries are skipped, not fatal
            log.warning("skipping JWKS key %s: %s", raw.get("kid"), exc)
            continue
        keys.append(_Key(raw.get("kid"), str(raw.get("kty")), raw.get("alg"), jwk.key))
    return keys


class JwksKeys:
    """The current key set; `key_for(kid, alg)` returns a verification key or raises KeyUnavailable."""

    def __init__(
        self,
        *,
        url: str | None = None,
        file: Path | None = None,
        cache_seconds: float = 300.0,
        min_refresh_seconds: float = 10.0,
        timeout: float = 5.0,
    ) -> None:
        if bool(url) == bool(file):
            raise ValueError("exactly one of jwks_url and jwks_file")
        if url:
            parts = urlsplit(url)
            if parts.scheme != "https" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
                raise ValueError("jwks_url must be https (plain http only on loopback)")
        self.url = url
        self.file = file
        self.cache_seconds = cache_seconds
        self.min_refresh_seconds = min_refresh_seconds
        self.timeout = timeout
        self._keys: list[_Key] = []
        self.generation = 0  # bumped whenever the key set changes
        self._loaded_at = 0.0
        self._last_attempt = -1e9
        self._file_mtime: float | None = None
        self._lock = asyncio.Lock()

    async def _fetch(self) -> list[_Key]:
        if self.file is not None:
            return _parse(json.loads(self.file.read_text()))
        assert self.url is not None
        async with httpx.AsyncClient(timeout=self.timeout) as http:
            r = await http.get(self.url, headers={"accept": "application/json"})
            r.raise_for_status()
            return _parse(r.json())

    def _stale(self) -> bool:
        if self.file is not None:
            try:
                return self.file.stat().st_mtime != self._file_mtime
            except OSError:
                return True
        return time.monotonic() - self._loaded_at > self.cache_seconds

    async def refresh(self, *, force: bool = False) -> None:
        async with self._lock:
            now = time.monotonic()
            if not force and not self._stale():
                return
            if self.url and now - self._last_attempt < self.min_refresh_seconds:
                # rate limit, with or without keys: a flood of unknown kids (or of requests while
                # the identity provider is down) must not become a flood of serialised fetches
                return
            self._last_attempt = now
            try:
                mtime = self.file.stat().st_mtime if self.file is not None else None
                keys = await self._fetch()
                if [(k.kid, k.kty, k.alg, k.key) for k in keys] != [(k.kid, k.kty, k.alg, k.key) for k in self._keys]:
                    self.generation += 1  # verified-token caches drop what the old set vouched for
                self._keys = keys
                self._loaded_at = now
                self._file_mtime = mtime
                log.info("loaded %d signing keys from %s", len(self._keys), self.url or self.file)
            except (OSError, ValueError, httpx.HTTPError) as exc:
                log.warning(
                    "JWKS refresh from %s failed (%s); keeping %d known keys",
                    self.url or self.file,
                    exc,
                    len(self._keys),
                )

    def _match(self, kid: str | None, alg: str) -> Any | None:
        types = ALG_KEY_TYPES.get(alg, ())
        fitting = [k for k in self._keys if k.kty in types and (k.alg is None or k.alg == alg)]
        if kid is None:
            return fitting[0].key if len(fitting) == 1 else None  # no guessing among several keys
        for k in fitting:
            if k.kid == kid:
                return k.key
        return None

    async def key_for(self, kid: str | None, alg: str) -> Any:
        await self.refresh()
        key = self._match(kid, alg)
        if key is None and kid is not None and not any(k.kid == kid for k in self._keys):
            await self.refresh(force=True)  # maybe the IdP rotated
            key = self._match(kid, alg)
        if key is None:
            if kid is not None and any(k.kid == kid for k in self._keys):
                raise KeyUnavailable(f"key {kid!r} cannot verify {alg}")
            raise KeyUnavailable("unknown signing key" + (f" {kid!r}" if kid else " (token names no kid)"))
        return key
