"""Fetching the provider's JWKS never stands in the way of tokens the keys we hold verify: a slow,
hung or hostile provider costs only the callers that need new keys, and at most the deadline.

The provider here is a local HTTP server on 127.0.0.1 that can answer slowly (a byte at a time),
not at all, or with too much; timing assertions are about orders of magnitude only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jwt
import pytest

from gateway.auth.jwks import JwksKeys, KeyUnavailable
from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig
from tests.auth.keys import AUDIENCE, ISSUER, IdP, claims_for


class Provider:
    """A JWKS endpoint: `doc()` as JSON, optionally after `delay` seconds, trickled `trickle`
    (bytes, seconds apart) before the body, or replaced by `body` (raw bytes)."""

    def __init__(self, idp: IdP) -> None:
        self.doc: Callable[[], Any] = idp.jwks
        self.delay = 0.0
        self.trickle: tuple[int, float] | None = None
        self.body: bytes | None = None
        self.length = True  # send content-length (else the body ends when the connection closes)
        self.hits = 0
        self._handlers: set[asyncio.Task[Any]] = set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.hits += 1
            body = self.body if self.body is not None else json.dumps(self.doc()).encode()
            await asyncio.sleep(self.delay)
            pad, every = self.trickle or (0, 0.0)
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            if self.length:
                head += b"content-length: %d\r\n" % (len(body) + pad)
            writer.write(head + b"\r\n")
            for _ in range(pad):  # leading whitespace: still valid JSON once it is all there
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(every)
            writer.write(body)
            await writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass  # the test is over, or the client gave up
        finally:
            writer.close()
            self._handlers.discard(task)

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/certs"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)


@pytest.fixture
def idp() -> IdP:
    p = IdP()
    p.add("RS256", kid="k1")
    return p


def authenticator(keys: JwksKeys) -> Authenticator:
    cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=keys.url, algorithms=("RS256",))
    return Authenticator(cfg, jwks=keys)


def unknown_kid_token() -> str:
    """Anyone can make one: an RS256 header naming a kid nobody published (the signature is never checked)."""
    stranger = IdP()
    stranger.add("RS256", kid="made-up")
    return stranger.token("made-up")


async def timed(call: Awaitable[Any], limit: float) -> tuple[Any, float]:
    """The result and how long it took; a call still running after `limit` seconds fails the test."""
    t0 = time.monotonic()
    result = await asyncio.wait_for(call, limit)
    return result, time.monotonic() - t0


async def until(condition: Callable[[], bool], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_a_cached_token_does_not_wait_for_a_trickling_fetch(idp: IdP) -> None:
    """h2_slowloris: a made-up kid starts a fetch the provider trickles for 15 s; a verified
    (cached) token, and a new token with a known kid, are served at once meanwhile."""

    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, min_refresh_seconds=0.0, timeout=30.0)
            auth = authenticator(keys)
            token = idp.token("k1")
            assert (await auth.authenticate(f"Bearer {token}")).sub == "idp-agent"
            provider.trickle = (15, 1.0)  # 15 s, each read well within httpx's per-read timeout
            attacker = asyncio.create_task(auth.authenticate(f"Bearer {unknown_kid_token()}"))
            await until(lambda: provider.hits == 2)  # the fetch is under way
            principal, took = await timed(auth.authenticate(f"Bearer {token}"), 10)
            assert principal.sub == "idp-agent" and took < 1.0, took
            fresh = idp.token("k1", sub="another-agent")  # not cached: verified with the keys we hold
            principal, took = await timed(auth.authenticate(f"Bearer {fresh}"), 10)
            assert principal.sub == "another-agent" and took < 1.0, took
            assert not attacker.done()  # only the caller that needs new keys waits
            attacker.cancel()
            await asyncio.gather(attacker, return_exceptions=True)
            assert provider.hits == 2

    asyncio.run(scenario())


def test_a_stale_key_set_is_refreshed_in_the_background(idp: IdP) -> None:
    """h2b_hung: past cache_seconds the provider hangs; tokens with a known kid are served with
    the keys we trust while one background fetch is tried (and cut at its deadline)."""

    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, cache_seconds=0.5, min_refresh_seconds=0.0, timeout=20.0)
            auth = authenticator(keys)
            token = idp.token("k1")
            await auth.authenticate(f"Bearer {token}")
            provider.delay = 3600
            await asyncio.sleep(0.6)  # stale by age
            for i in range(5):
                principal, took = await timed(auth.authenticate(f"Bearer {token}"), 10)
                assert principal.sub == "idp-agent" and took < 1.0, took
                fresh = idp.token("k1", sub=f"agent-{i}")
                principal, took = await timed(auth.authenticate(f"Bearer {fresh}"), 10)
                assert principal.sub == f"agent-{i}" and took < 1.0, took
            await until(lambda: provider.hits == 2)
            assert provider.hits == 2  # one fetch for all of them (single flight)

    asyncio.run(scenario())


def test_past_the_staleness_bound_callers_wait_but_only_until_the_deadline(idp: IdP) -> None:
    """A key set no fetch has confirmed for cache_seconds + max_stale_seconds (an idle gateway) is
    not used before a fetch is tried; a hung provider costs that wait at most the deadline, and
    the keys we trust are kept."""

    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, cache_seconds=0.2, min_refresh_seconds=0.0, timeout=1.0, max_stale_seconds=0.0)
            auth = authenticator(keys)
            token = idp.token("k1")
            await auth.authenticate(f"Bearer {token}")
            provider.delay = 3600
            await asyncio.sleep(0.3)
            principal, took = await timed(auth.authenticate(f"Bearer {token}"), 15)
            assert principal.sub == "idp-agent" and 0.5 < took < 10, took
            assert provider.hits == 2

    asyncio.run(scenario())


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_the_fetch_is_cut_at_its_deadline(idp: IdP, length: bool) -> None:
    """A provider sending a byte every 0.5 s for 60 s: each read is within httpx's timeout, the
    whole fetch is not; it fails after about `timeout` seconds and the keys are kept."""

    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, min_refresh_seconds=0.0, timeout=1.0)
            await keys.refresh(force=True)
            before = keys.generation
            provider.trickle, provider.length = (120, 0.5), length
            idp.add("RS256", kid="k2")
            _, took = await timed(keys.refresh(force=True), 15)
            assert took < 10, took
            assert keys.generation == before and keys._match("k1", "RS256") is not None
            assert keys._match("k2", "RS256") is None  # the new key never arrived

    asyncio.run(scenario())


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_an_oversized_jwks_is_a_failed_refresh(idp: IdP, length: bool, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, min_refresh_seconds=0.0)
            await keys.refresh(force=True)
            before = keys.generation
            rotated = IdP()
            rotated.add("RS256", kid="k2")
            doc = rotated.jwks()
            doc["padding"] = "x" * (2 << 20)  # a valid JWKS naming only k2, of 2 MiB
            provider.body, provider.length = json.dumps(doc).encode(), length
            with caplog.at_level(logging.WARNING, "pvegate.jwks"):
                await keys.refresh(force=True)
            assert keys.generation == before  # k1 kept, k2 not taken
            assert keys._match("k1", "RS256") is not None and keys._match("k2", "RS256") is None
            assert "larger than" in caplog.text

    asyncio.run(scenario())


def test_concurrent_unknown_kids_share_one_fetch(idp: IdP) -> None:
    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, min_refresh_seconds=0.0)
            auth = authenticator(keys)
            await auth.authenticate(f"Bearer {idp.token('k1')}")
            provider.delay = 0.5
            forged = unknown_kid_token()
            out = await asyncio.gather(
                *(auth.authenticate(f"Bearer {forged}") for _ in range(20)), return_exceptions=True
            )
            assert all(isinstance(e, AuthError) and "unknown signing key" in str(e) for e in out)
            assert provider.hits == 2  # the first load, then one fetch for all twenty

    asyncio.run(scenario())


BAD_ENTRIES: list[dict[str, Any]] = [
    {"kty": "RSA", "kid": "alg-list", "alg": ["RS256"], "n": "AQAB", "e": "AQAB"},
    {"kty": "RSA", "kid": "alg-object", "alg": {"RS256": 1}},
    {"kty": ["RSA"], "kid": "kty-list"},
    {"kty": "RSA", "kid": {"nested": "kid"}, "alg": "RS256"},
    {"kty": "RSA", "kid": "n-number", "alg": "RS256", "n": 5, "e": "AQAB"},
    {"kty": "EC", "kid": "crv-list", "crv": ["P-256"], "x": "AA", "y": "AA"},
    {"kty": "OKP", "kid": "okp-no-x", "crv": "Ed25519"},
]


def test_malformed_entries_are_skipped_from_a_url(idp: IdP) -> None:
    """h3_url: one bad entry neither escapes as a 500 nor blocks the good keys beside it."""

    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, cache_seconds=0.2, min_refresh_seconds=0.0)
            auth = authenticator(keys)
            old = idp.token("k1")
            await auth.authenticate(f"Bearer {old}")
            idp.add("RS256", kid="k2")
            provider.doc = lambda: {"keys": [k for k in idp.jwks()["keys"] if k["kid"] != "k1"] + BAD_ENTRIES}
            await keys.refresh(force=True)
            assert (await auth.authenticate(f"Bearer {idp.token('k2')}")).sub == "idp-agent"
            with pytest.raises(AuthError, match="unknown signing key"):
                await auth.authenticate(f"Bearer {old}")  # removed at the provider: dropped here

    asyncio.run(scenario())


def test_malformed_entries_are_skipped_from_a_file(idp: IdP, tmp_path: Path) -> None:
    """h3_jwks_typeerror: the same from auth.jwks_file."""
    path = idp.write(tmp_path / "jwks.json")
    cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=path, algorithms=("RS256",))
    auth = Authenticator(cfg)
    token = idp.token("k1")

    async def scenario() -> None:
        assert (await auth.authenticate(f"Bearer {token}")).sub == "idp-agent"
        idp.add("RS256", kid="k2")
        doc = idp.jwks()
        doc["keys"] += BAD_ENTRIES
        path.write_text(json.dumps(doc))
        os.utime(path, (time.time() + 5, time.time() + 5))
        for _ in range(3):
            assert (await auth.authenticate(f"Bearer {token}")).sub == "idp-agent"
        assert (await auth.authenticate(f"Bearer {idp.token('k2')}")).sub == "idp-agent"

    asyncio.run(scenario())


BROKEN_BODIES = {
    "deep": b"[" * 200_000 + b"]" * 200_000,  # RecursionError in the JSON parser
    "deep-keys": b'{"keys": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    "not-json": b"<html>hello</html>",
    "not-utf8": b'{"keys": ["\xff"]}',
    "keys-not-list": b'{"keys": {"kty": "RSA"}}',
    "truncated": b'{"keys": [{"kty": "RS',
}


@pytest.mark.parametrize("name", sorted(BROKEN_BODIES))
def test_any_broken_document_is_a_failed_refresh(idp: IdP, tmp_path: Path, name: str) -> None:
    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, min_refresh_seconds=0.0)
            await keys.refresh(force=True)
            before = keys.generation
            provider.body = BROKEN_BODIES[name]
            await keys.refresh(force=True)
            assert keys.generation == before and keys._match("k1", "RS256") is not None

            path = idp.write(tmp_path / "jwks.json")
            from_file = JwksKeys(file=path)
            await from_file.refresh()
            path.write_bytes(BROKEN_BODIES[name])
            os.utime(path, (time.time() + 5, time.time() + 5))
            await from_file.refresh()
            assert from_file.generation == 1 and from_file._match("k1", "RS256") is not None

    asyncio.run(scenario())


def test_a_forged_kid_cannot_hold_up_others_through_the_authenticator_cache(idp: IdP) -> None:
    """The same through the verified-token cache of an Authenticator built from configuration."""

    async def scenario() -> None:
        provider = Provider(idp)
        async with provider as url:
            cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=url, algorithms=("RS256",))
            auth = Authenticator(cfg)
            assert auth.jwks is not None
            auth.jwks.min_refresh_seconds = 0.0
            token = idp.token("k1")
            await auth.authenticate(f"Bearer {token}")
            provider.delay = 3600
            header = jwt.utils.base64url_encode(json.dumps({"alg": "RS256", "kid": "garbage"}).encode()).decode()
            evil = header + "." + jwt.encode(claims_for(), "x" * 32, algorithm="HS256").split(".", 1)[1]
            attacker = asyncio.create_task(auth.authenticate(f"Bearer {evil}"))
            await until(lambda: provider.hits == 2)
            for _ in range(3):
                _, took = await timed(auth.authenticate(f"Bearer {token}"), 10)
                assert took < 1.0, took
            attacker.cancel()
            await asyncio.gather(attacker, return_exceptions=True)

    asyncio.run(scenario())


def test_a_jwks_file_is_not_read_again_for_each_forged_kid_nor_a_missing_one_logged_each_time(
    idp: IdP, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """auth.jwks_file kept the URL's promise of no amplification only in name (found by a review): each
    token naming an unknown kid re-read and re-parsed the file and logged it, and a missing file was
    re-read and warned about on every request. A forced re-read is now rate-limited as a fetch is, and
    a failure is reported once until the file changes."""
    path = idp.write(tmp_path / "jwks.json")
    keys = JwksKeys(file=path)

    async def scenario() -> None:
        with caplog.at_level(logging.INFO, logger="pvegate.jwks"):
            for i in range(200):
                with pytest.raises(KeyUnavailable):
                    await keys.key_for(f"forged-{i}", "RS256")
            loads = [r for r in caplog.records if "loaded" in r.getMessage()]
            assert len(loads) == 1, len(loads)  # the first read only (within min_refresh_seconds)
            caplog.clear()
            path.unlink()
            os.utime(tmp_path, None)
            for _ in range(200):
                await keys.ready()
            failures = [r for r in caplog.records if "refresh from" in r.getMessage()]
            assert len(failures) == 1, len(failures)
            assert keys._match("k1", "RS256") is not None  # the known keys are kept
            idp.write(path)  # back: read at once
            os.utime(path, (time.time() + 5, time.time() + 5))
            await keys.ready()
            assert any("loaded" in r.getMessage() for r in caplog.records)

    asyncio.run(scenario())
