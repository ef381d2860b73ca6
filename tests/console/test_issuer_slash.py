"""An identity provider whose issuer ends in a slash (Auth0's is `https://TENANT.auth0.com/`) signs people
in to the console: the configuration drops the slash from `console.issuer`, and the ID token used to be
compared with that, never with the issuer the provider names, so nobody could sign in. The check stays
exact: the discovery document must name the configured issuer (with or without its one trailing slash),
and the ID token must carry exactly the issuer the discovery document names.

The provider is a local HTTP server on 127.0.0.1 serving a discovery document and a JWKS with real keys
(tests/auth/keys.py), as tests/auth/test_jwks_fetch.py serves its JWKS."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.admin.console.oidc import Login, Provider, SignInError, pkce_pair
from gateway.core.config import ConsoleConfig
from tests.auth.keys import IdP

CLIENT = "pvegate-console"


class Discovery:
    """An OpenID provider's two documents: discovery (naming `issuer`, as set) and the JWKS."""

    def __init__(self, idp: IdP) -> None:
        self.idp = idp
        self.base = ""
        self.issuer = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            if path.endswith("/.well-known/openid-configuration"):
                doc: Any = {
                    "issuer": self.issuer,
                    "authorization_endpoint": self.base + "/tenant/authorize",
                    "token_endpoint": self.base + "/tenant/token",
                    "jwks_uri": self.base + "/tenant/jwks",
                }
            elif path == "/tenant/jwks":
                doc = self.idp.jwks()
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            body = json.dumps(doc).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + b"content-length: %d\r\n\r\n" % len(body)
                + body
            )
            await writer.drain()
        finally:
            writer.close()

    async def run(self, scenario: Callable[[], Awaitable[None]]) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            await scenario()
        finally:
            server.close()
            await server.wait_closed()


def attempt() -> Login:
    return Login("state-1", "nonce-1", pkce_pair()[0], "/admin/approvals", None)


def id_token(idp: IdP, iss: str) -> str:
    now = int(time.time())
    claims = {"iss": iss, "aud": CLIENT, "sub": "alice", "iat": now, "exp": now + 300, "nonce": "nonce-1"}
    return idp.token("k1", **claims, auth_time=now - 5, nbf=None, realm_access=None, groups=None, scope=None)


@pytest.fixture
def idp() -> IdP:
    p = IdP()
    p.add("RS256", kid="k1")
    return p


def test_an_issuer_with_a_trailing_slash_signs_in(idp: IdP) -> None:
    d = Discovery(idp)

    async def scenario() -> None:
        d.issuer = d.base + "/tenant/"  # what the provider names, and the tokens carry
        # console.issuer as configured is d.issuer; the configuration may hand it over without the slash
        for configured in (d.base + "/tenant", d.base + "/tenant/"):
            p = Provider(ConsoleConfig(enabled=True, issuer=configured, client_id=CLIENT))
            claims = await p.verify_id_token(id_token(idp, d.issuer), attempt())
            assert claims["iss"] == d.issuer and claims["sub"] == "alice"
            # exact all the same: the token must carry the issuer the provider names, no other spelling
            for other in (d.base + "/tenant", d.base + "/tenant//", d.base + "/tenant/x"):
                with pytest.raises(SignInError, match="does not verify"):
                    await p.verify_id_token(id_token(idp, other), attempt())

    asyncio.run(d.run(scenario))


def test_a_discovery_document_naming_another_issuer_is_refused(idp: IdP) -> None:
    d = Discovery(idp)

    async def scenario() -> None:
        for named in ("/tenant//", "/tenant/x", "/other", "/other/"):
            d.issuer = d.base + named
            p = Provider(ConsoleConfig(enabled=True, issuer=d.base + "/tenant", client_id=CLIENT))
            with pytest.raises(SignInError, match="names another issuer"):
                await p.verify_id_token(id_token(idp, d.issuer), attempt())
        # without a slash at the provider, the configured issuer and its tokens are as before
        d.issuer = d.base + "/tenant"
        p = Provider(ConsoleConfig(enabled=True, issuer=d.issuer, client_id=CLIENT))
        assert (await p.verify_id_token(id_token(idp, d.issuer), attempt()))["iss"] == d.issuer
        with pytest.raises(SignInError, match="does not verify"):
            await p.verify_id_token(id_token(idp, d.issuer + "/"), attempt())

    asyncio.run(d.run(scenario))
