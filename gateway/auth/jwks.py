"""Signing keys from an identity provider's JWKS (a URL or a file), cached, rotated by `kid`.

A token naming a `kid` we do not hold triggers at most one refresh per
`min_refresh_seconds` (rotation without restart, no amplification by forged
kids); a failed refresh keeps serving the keys we already trust.

Fetching never stands in the way of tokens the keys we hold can verify. One fetch at a time
(single flight), cut at `timeout` seconds in total (however slowly the provider sends) and at
`MAX_JWKS_BYTES`. A key set older than `cache_seconds` is refreshed in the background and used
meanwhile; only a caller that needs keys we do not hold (an unknown kid, no keys yet) waits for
the fetch. The staleness is bounded: when no fetch has completed (succeeded or failed) for
`cache_seconds + max_stale_seconds` (a gateway that was idle), callers wait for the fetch, at
most `timeout` seconds, so a key the provider removed is trusted at most
`cache_seconds + max_stale_seconds` after it was fetched, as long as the provider answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt

from gateway.core.config_schema import jwks_url_in_clear
from gateway.core.text import quoted

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

# A JWKS larger than this is refused (a failed refresh): real ones are a few KiB.
MAX_JWKS_BYTES = 1 << 20
# How long past cache_seconds a key set is used while it is refreshed in the background.
MAX_STALE_SECONDS = 60.0
# How much of a token header value (kid, alg) a message may quote: they are the sender's choice.
SHOWN_CHARS = 64


def shown(value: Any) -> str:
    """repr() of an untrusted value, cut to SHOWN_CHARS: safe to put in a reply or the audit."""
    return quoted(value, SHOWN_CHARS)


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
        kid, kty, alg = raw.get("kid"), raw.get("kty"), raw.get("alg")
        if not isinstance(kty, str) or not isinstance(kid, str | None) or not isinstance(alg, str | None):
            log.warning("skipping JWKS key %s: kty, kid and alg must be strings", shown(kid))
            continue
        try:
            jwk = jwt.PyJWK.from_dict(raw)
        except Exception as exc:  # unsupported or broken entries are skipped, not fatal
            log.warning("skipping JWKS key %s: %s", shown(kid), shown(str(exc)))
            continue
        keys.append(_Key(kid, kty, alg, jwk.key))
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
        max_stale_seconds: float = MAX_STALE_SECONDS,
        max_bytes: int = MAX_JWKS_BYTES,
        algorithms: tuple[str, ...] | None = None,
    ) -> None:
        if bool(url) == bool(file):
            raise ValueError("exactly one of jwks_url and jwks_file")
        if url:
            if jwks_url_in_clear(url):
                raise ValueError("jwks_url must be https (plain http only on loopback)")
        self.url = url
        self.file = file
        self.cache_seconds = cache_seconds
        self.min_refresh_seconds = min_refresh_seconds
        self.timeout = timeout  # the whole fetch: connecting, the headers and every byte of the body
        self.max_stale_seconds = max_stale_seconds
        self.max_bytes = max_bytes
        self.algorithms = algorithms  # the ones tokens may use (auth.algorithms); None: any (key_count)
        self._keys: list[_Key] = []
        self.generation = 0  # bumped whenever the key set changes
        self._loaded_at = float("-inf")  # when the fetch that gave the current keys started
        self._settled_at = float("-inf")  # when the last fetch ended, however it ended
        self._last_attempt = float("-inf")
        # the file's identity when read last (device, inode, size, mtime, ctime), or why it could not be
        # stat'ed: an mtime alone misses a new file with the old mtime (a Nix store path, `cp -p`, `tar x`)
        self._file_state: tuple[int, ...] | str | None = None
        self._flight: asyncio.Task[None] | None = None  # the one fetch under way
        # why the last fetch failed (None: it did not, or none ended yet), for readiness (observability/health.py):
        # `failure` in the gateway's own words or the exception's type, `failure_detail` the exception's text
        self.failure: str | None = None
        self.failure_detail: str | None = None

    def _read_file(self) -> list[_Key]:
        assert self.file is not None
        with self.file.open("rb") as f:
            body = f.read(self.max_bytes + 1)
        if len(body) > self.max_bytes:
            raise ValueError(f"the JWKS is larger than {self.max_bytes} bytes")
        return _parse(json.loads(body))

    async def _download(self) -> list[_Key]:
        assert self.url is not None
        async with asyncio.timeout(self.timeout):  # httpx's timeout is per read: a trickle never trips it
            async with (
                httpx.AsyncClient(timeout=self.timeout) as http,
                http.stream("GET", self.url, headers={"accept": "application/json"}) as r,
            ):
                r.raise_for_status()
                declared = r.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_bytes:
                    raise ValueError(f"the JWKS is larger than {self.max_bytes} bytes")
                body = bytearray()
                async for chunk in r.aiter_bytes():  # decoded: a compressed body is counted unpacked
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise ValueError(f"the JWKS is larger than {self.max_bytes} bytes")
        return _parse(json.loads(bytes(body)))

    def _install(self, keys: list[_Key], started: float, state: tuple[int, ...] | str | None) -> None:
        if [(k.kid, k.kty, k.alg, k.key) for k in keys] != [(k.kid, k.kty, k.alg, k.key) for k in self._keys]:
            self.generation += 1  # verified-token caches drop what the old set vouched for
        self._keys = keys
        self._loaded_at = started
        self._file_state = state
        self.failure = self.failure_detail = None
        log.info("loaded %d signing keys from %s", len(self._keys), self.url or self.file)

    def _failed(self, exc: BaseException) -> None:
        self.failure, self.failure_detail = self._failure(exc)
        why = f"no complete answer within {self.timeout:g} s" if isinstance(exc, TimeoutError) else shown(str(exc))
        log.warning(
            "JWKS refresh from %s failed (%s: %s); keeping %d known keys",
            self.url or self.file,
            type(exc).__name__,
            why,
            len(self._keys),
        )

    def _failure(self, exc: BaseException) -> tuple[str, str | None]:
        """(what anyone may read, the rest): the gateway's own words or the exception's type, and the
        exception's text without the URL (its query may carry a credential), cut."""
        if isinstance(exc, TimeoutError):
            return f"no complete answer within {self.timeout:g} s", None
        if isinstance(exc, httpx.HTTPStatusError):  # its text names the URL
            return f"HTTP {exc.response.status_code}", None
        text = str(exc)
        if self.url:
            text = text.replace(self.url, "auth.jwks_url")
        return type(exc).__name__, text[:200] or None

    @property
    def key_count(self) -> int:
        """How many keys held can verify a token of an accepted algorithm: none, and no token verifies (an
        `oct` or EC key when only RS256 is accepted is held, and of no use)."""
        if self.algorithms is None:
            return len(self._keys)
        return sum(
            any(k.kty in ALG_KEY_TYPES.get(a, ()) and (k.alg is None or k.alg == a) for a in self.algorithms)
            for k in self._keys
        )

    @property
    def loaded_at(self) -> float | None:
        """When the fetch that gave the keys held started (monotonic), or None: no fetch has succeeded."""
        return None if self._loaded_at == float("-inf") else self._loaded_at

    def _refresh_file(self, *, force: bool = False) -> None:
        """A file is read at once, without waiting on anything, whenever it changed; `force` (a token naming
        an unknown key) reads it again at most every min_refresh_seconds, as a URL is fetched: forged kids
        cause no re-read each. A file that is missing or unreadable is reported once, until it changes."""
        assert self.file is not None
        started = time.monotonic()
        try:
            st = self.file.stat()
            state: tuple[int, ...] | str = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError as exc:
            state = f"{type(exc).__name__}: {exc.strerror}"
        if state == self._file_state and not (force and started - self._last_attempt >= self.min_refresh_seconds):
            return
        self._last_attempt, self._file_state = started, state
        try:
            if isinstance(state, str):
                raise OSError(state)
            keys = self._read_file()
        except Exception as exc:  # anything wrong with the document is a failed refresh
            self._failed(exc)
        else:
            self._install(keys, started, state)
        finally:
            self._settled_at = time.monotonic()

    async def _fetch(self) -> None:
        started = time.monotonic()
        try:
            keys = await self._download()
        except Exception as exc:  # the deadline, the size cap, HTTP, JSON (even RecursionError): all a failure
            self._failed(exc)
        else:
            self._install(keys, started, None)
        finally:
            self._settled_at = time.monotonic()

    def _stale(self) -> bool:
        return time.monotonic() - self._loaded_at > self.cache_seconds

    def _overdue(self) -> bool:
        """No fetch has ended for longer than the staleness bound (or none ever has)."""
        return time.monotonic() - self._settled_at > self.cache_seconds + self.max_stale_seconds

    def _start(self, *, force: bool) -> asyncio.Task[None] | None:
        """The fetch under way, else a new one when it is due and the rate limit allows, else None."""
        loop = asyncio.get_running_loop()
        flight = self._flight
        if flight is not None and not flight.done() and flight.get_loop() is loop:
            return flight
        now = time.monotonic()
        if not force and not self._stale():
            return None
        if now - self._last_attempt < self.min_refresh_seconds:
            # rate limit, with or without keys: a flood of unknown kids (or of requests while
            # the identity provider is down) must not become a flood of fetches
            return None
        self._last_attempt = now
        self._flight = loop.create_task(self._fetch(), name="pvegate-jwks-refresh")
        return self._flight

    async def ready(self) -> int:
        """The generation of a key set fit to verify with now, without waiting on the provider
        unless the set is past the staleness bound: a stale set starts a background refresh."""
        if self.file is not None:
            self._refresh_file()
        else:
            flight = self._start(force=False)
            if flight is not None and self._overdue():
                await asyncio.shield(flight)  # a caller that goes away does not cancel the shared fetch
        return self.generation

    async def refresh(self, *, force: bool = False) -> None:
        """Start (or join) a fetch when it is due (`force`: now, rate limit permitting) and wait for it."""
        if self.file is not None:
            self._refresh_file(force=force)
            return
        flight = self._start(force=force)
        if flight is not None:
            await asyncio.shield(flight)

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
        await self.ready()
        key = self._match(kid, alg)
        if key is None and (not self._keys or (kid is not None and not any(k.kid == kid for k in self._keys))):
            await self.refresh(force=True)  # maybe the IdP rotated; only this caller waits
            key = self._match(kid, alg)
        if key is None:
            if kid is not None and any(k.kid == kid for k in self._keys):
                raise KeyUnavailable(f"key {shown(kid)} cannot verify {alg}")
            raise KeyUnavailable("unknown signing key" + (f" {shown(kid)}" if kid else " (token names no kid)"))
        return key
