"""Readiness knows the identity provider's keys: a gateway on `auth.jwks_url` that holds no signing key
refuses every token (401), so /readyz says not ready, with the reason, until keys load; keys once
loaded stay trusted while the provider is down (docs/identity.md), and readiness stays green.

Real processes: `pvegate serve` with its managed OPA and the simulator; the provider is a local HTTP
server on 127.0.0.1 serving a JWKS of real keys (pyjwt verifies every token), started and stopped on
one port. Static keys (a JWKS file) have no such check.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.core.config import load
from gateway.dev.devenv import AUDIENCE, ISSUER, DevEnv
from tests.auth.keys import IdP
from tests.health.conftest import health_env, serving, wait_for
from tests.support import free_port

REASON = "identity: no signing key loaded from auth.jwks_url (last fetch failed: "


class Provider:
    """The identity provider's JWKS endpoint on a fixed loopback port: `up()` serves `idp`'s keys (or
    HTTP `status` when set), `down()` closes the port (connection refused). `hits` counts requests."""

    def __init__(self, idp: IdP) -> None:
        self.idp = idp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/certs"
        self.status: int | None = None
        self.hits = 0
        self._server: ThreadingHTTPServer | None = None

    def up(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                if outer.status is not None:
                    self.send_response(outer.status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body = json.dumps(outer.idp.jwks()).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="jwks-provider").start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def jwks_env(tmp_path: Path, sim: Any, provider: Provider) -> DevEnv:
    """health_env with RS256 tokens verified by the provider's keys (no HS256 secret), keys refreshed after 1 s."""
    env = health_env(tmp_path, sim)
    raw = yaml.safe_load(env.config_path.read_text())
    auth = raw["auth"]
    auth.pop("hs256_secret")
    auth.update(algorithms=["RS256"], jwks_url=provider.url, jwks_cache_seconds=1)
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dataclasses.replace(env, config=load(env.config_path))


async def tools_list(http: httpx.AsyncClient, env: DevEnv, token: str) -> httpx.Response:
    return await http.post(
        env.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={
            "Authorization": f"Bearer {token}",
            "MCP-Protocol-Version": "2025-06-18",
            "Accept": "application/json, text/event-stream",
        },
    )


def _ready(r: httpx.Response) -> bool:
    return r.status_code == 200


async def admin_health(http: httpx.AsyncClient, env: DevEnv, base: str) -> dict[str, Any]:
    token = env.config.admin.token.read()  # type: ignore[union-attr]
    doc: dict[str, Any] = (await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {token}"})).json()
    return doc


async def test_no_signing_key_is_unready_until_keys_load_and_an_outage_after_keeps_it_ready(
    hsim: Any, tmp_path: Path
) -> None:
    idp = IdP()
    kid = idp.add("RS256", kid="k1")
    provider = Provider(idp)  # down: nothing listens on its port
    env = jwks_env(tmp_path, hsim, provider)
    token = idp.token(kid, iss=ISSUER, aud=AUDIENCE)
    try:
        async with serving(env, tmp_path / "gateway.log", until="livez") as (http, base):
            # no key ever loaded: every token is refused, and readiness says so, in the gateway's own words
            r = await http.get(base + "/readyz")
            assert r.status_code == 503, r.text
            doc = r.json()
            [reason] = [x for x in doc["reasons"] if x.startswith("identity:")]
            assert reason == REASON + "ConnectError; details in /admin/health)", doc
            assert str(provider.port) not in r.text  # the provider's address is not public
            assert doc["checks"]["identity"]["ok"] is False and doc["checks"]["identity"]["keys"] == 0
            assert all(c["ok"] for name, c in doc["checks"].items() if name != "identity"), doc
            refused = await tools_list(http, env, token)
            assert refused.status_code == 401 and "unknown signing key" in refused.text, refused.text
            private = await admin_health(http, env, base)
            assert private["status"] == "unready"
            assert private["checks"]["identity"]["detail"].startswith(
                "no signing key loaded from auth.jwks_url (last fetch failed: ConnectError: "
            ), private["checks"]["identity"]
            assert provider.url not in json.dumps(private)  # a query may carry a credential: never shown

            # the provider comes up: ready without any traffic, within the fetch rate limit (10 s) and a probe
            provider.up()
            green, took = await wait_for(http, base + "/readyz", _ready, timeout=20)
            assert green.json()["reasons"] == [] and green.json()["checks"]["identity"]["keys"] == 1
            assert took < 15, f"ready only {took:.1f} s after the provider came up"
            assert provider.hits <= 2, provider.hits  # not a fetch per probe
            accepted = await tools_list(http, env, token)
            assert accepted.status_code == 200, accepted.text

            # the provider goes away again: the keys last fetched stay trusted, readiness stays green
            provider.down()
            deadline = time.monotonic() + 25
            while (await admin_health(http, env, base))["checks"]["identity"]["last_fetch_error"] is None:
                assert time.monotonic() < deadline, "no refresh was tried with the provider down"
                # a fresh token each time (not the verified-token cache): the stale key set is refreshed
                assert (await tools_list(http, env, idp.token(kid, iss=ISSUER, aud=AUDIENCE))).status_code == 200
                await asyncio.sleep(0.5)
            still = await http.get(base + "/readyz")
            assert still.status_code == 200, still.text
            assert "last_fetch_error" not in still.json()["checks"]["identity"]  # private only
            assert (await tools_list(http, env, idp.token(kid, iss=ISSUER, aud=AUDIENCE))).status_code == 200
    finally:
        provider.down()


async def test_an_unready_gateway_asks_the_provider_boundedly(hsim: Any, tmp_path: Path) -> None:
    """A provider answering 503: readiness polled hard and tokens sent meanwhile cost at most one fetch per
    10 s (the key cache's own rate limit), not one per probe or request; its keys served, ready again."""
    idp = IdP()
    kid = idp.add("RS256", kid="k1")
    provider = Provider(idp)
    provider.status = 503
    provider.up()
    env = jwks_env(tmp_path, hsim, provider)
    try:
        async with serving(env, tmp_path / "gateway.log", until="livez") as (http, base):
            started = time.monotonic()
            r = await http.get(base + "/readyz")
            assert r.status_code == 503 and REASON + "HTTP 503)" in r.json()["reasons"], r.text
            for _ in range(10):
                for _ in range(10):
                    assert (await http.get(base + "/readyz")).status_code == 503
                refused = await tools_list(http, env, idp.token(kid, iss=ISSUER, aud=AUDIENCE))
                assert refused.status_code == 401
                await asyncio.sleep(0.2)
            elapsed = time.monotonic() - started
            assert provider.hits <= 2 + int(elapsed / 10), (provider.hits, elapsed)
            provider.status = None
            await wait_for(http, base + "/readyz", _ready, timeout=20)
            assert (await tools_list(http, env, idp.token(kid, iss=ISSUER, aud=AUDIENCE))).status_code == 200
    finally:
        provider.down()


async def test_a_jwks_file_has_no_identity_check(hsim: Any, tmp_path: Path) -> None:
    """Static keys (auth.jwks_file) are read when the file changes: no provider to wait for, no check."""
    idp = IdP()
    kid = idp.add("RS256", kid="k1")
    env = health_env(tmp_path, hsim)
    raw = yaml.safe_load(env.config_path.read_text())
    raw["auth"].pop("hs256_secret")
    raw["auth"].update(algorithms=["RS256"], jwks_file=str(idp.write(tmp_path / "jwks.json")))
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dataclasses.replace(env, config=load(env.config_path))
    async with serving(env, tmp_path / "gateway.log", until="livez") as (http, base):
        r, _ = await wait_for(http, base + "/readyz", _ready, timeout=20)
        assert "identity" not in r.json()["checks"]
        assert (await tools_list(http, env, idp.token(kid, iss=ISSUER, aud=AUDIENCE))).status_code == 200


async def test_hs256_accepted_too_keeps_an_unreachable_jwks_from_readiness(hsim: Any, tmp_path: Path) -> None:
    """With HS256 accepted beside the provider's keys, its secret verifies tokens whatever the provider does:
    the replica serves, so it stays ready (a balancer would pull a working gateway)."""
    provider = Provider(IdP())  # down
    env = health_env(tmp_path, hsim)
    raw = yaml.safe_load(env.config_path.read_text())
    raw["auth"].update(algorithms=["HS256", "RS256"], jwks_url=provider.url)
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = dataclasses.replace(env, config=load(env.config_path))
    async with serving(env, tmp_path / "gateway.log", until="livez") as (http, base):
        r, _ = await wait_for(http, base + "/readyz", _ready, timeout=20)
        assert "identity" not in r.json()["checks"]
        assert (await tools_list(http, env, env.token("hs-agent", ["operator"]))).status_code == 200


async def test_a_jwks_with_no_key_for_the_accepted_algorithms_is_unready(hsim: Any, tmp_path: Path) -> None:
    """Keys held that no accepted algorithm can use (an EC key, RS256 accepted) verify no token: not ready."""
    idp = IdP()
    ec = idp.add("ES256", kid="ec1")
    provider = Provider(idp)
    provider.up()
    env = jwks_env(tmp_path, hsim, provider)
    try:
        async with serving(env, tmp_path / "gateway.log", until="livez") as (http, base):
            r, _ = await wait_for(http, base + "/readyz", lambda r: r.status_code == 503, timeout=20)
            assert "identity: the JWKS at auth.jwks_url holds no usable signing key" in r.json()["reasons"], r.text
            assert (await tools_list(http, env, idp.token(ec, iss=ISSUER, aud=AUDIENCE))).status_code == 401
    finally:
        provider.down()
