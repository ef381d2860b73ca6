"""Tokens that say they are logout or refresh tokens are not access tokens (gateway/auth/tokens.py).

Found in review: Keycloak's back-channel logout token says what it is in its payload (`typ: Logout`,
and the OpenID Back-Channel Logout `events` claim), as its refresh tokens do (`typ: Refresh`,
`Offline`); only the header form of a logout token (`typ: logout+jwt`) was refused, so a validly
signed logout token whose `aud` is auth.audience reached the tools as its subject."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core.config import AuthConfig
from gateway.dev.devenv import DevEnv
from tests.auth.keys import AUDIENCE, ISSUER, IdP
from tests.support import GatewayThread, audit_rows, free_port

LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
BACKCHANNEL_LOGOUT = "http://schemas.openid.net/event/backchannel-logout"


@dataclasses.dataclass
class Live:
    idp: IdP
    url: str
    ca: ssl.SSLContext
    env: DevEnv
    audit: Path


@pytest.fixture(scope="module")
def live(env: DevEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A gateway trusting an RS256 key set, with the default mapping and no required scope (a
    logout token carries no scope, so auth.required_scopes would hide the defect)."""
    tmp = tmp_path_factory.mktemp("s46tt")
    idp = IdP()
    idp.add("RS256", kid="k1")
    port = free_port()
    cfg = dataclasses.replace(
        env.config,
        port=port,
        public_url=f"https://127.0.0.1:{port}",
        audit_path=tmp / "audit.db",
        auth=AuthConfig(
            issuer=ISSUER,
            audience=AUDIENCE,
            jwks_file=idp.write(tmp / "jwks.json"),
            algorithms=("RS256",),
            roles_claim="realm_access.roles",
        ),
    )
    gw = GatewayThread(cfg).start()
    try:
        yield Live(
            idp,
            f"https://127.0.0.1:{port}/mcp",
            ssl.create_default_context(cafile=str(env.ca_file)),
            env,
            cfg.audit_path,
        )
    finally:
        gw.stop()


def post(live: Live, token: str) -> httpx.Response:
    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-11-25",
    }
    with httpx.Client(verify=live.ca, timeout=30) as http:
        return http.post(live.url, json=LIST, headers=headers)


@pytest.mark.parametrize(
    ("headers", "claims", "what"),
    [
        # Keycloak's back-channel logout token, as Keycloak writes it
        ({"typ": "JWT"}, {"typ": "Logout", "sid": "s1", "events": {BACKCHANNEL_LOGOUT: {}}}, "a logout token"),
        # any OpenID Back-Channel Logout token: the events claim names it, whatever typ says
        ({}, {"events": {BACKCHANNEL_LOGOUT: {}}, "sid": "s1"}, "a logout token"),
        ({"typ": "secevent+jwt"}, {"events": {BACKCHANNEL_LOGOUT: {}}}, "a security event token"),
        ({}, {"typ": "Refresh"}, "a refresh token"),  # Keycloak's refresh token
        ({}, {"typ": "Offline"}, "a refresh token"),  # and its offline token
    ],
    ids=["keycloak-logout", "bcl-events", "secevent-header", "refresh", "offline"],
)
def test_logout_and_refresh_tokens_are_refused(
    live: Live, headers: dict[str, Any], claims: dict[str, Any], what: str
) -> None:
    token = live.idp.token("k1", headers=headers, **claims)
    before = len(audit_rows(live.audit))
    r = post(live, token)
    assert r.status_code == 401, r.text[:300]
    assert r.json() == {"error": "invalid_token", "error_description": f"token is {what}, not an access token"}
    assert 'error="invalid_token"' in r.headers["www-authenticate"]
    rows = [row for row in audit_rows(live.audit)[before:] if row["kind"] == "auth_failure"]
    assert len(rows) == 1 and "not an access token" in rows[0]["body"]


@pytest.mark.parametrize(
    ("headers", "claims"),
    [({}, {}), ({"typ": "at+jwt"}, {"typ": "Bearer"}), ({}, {"events": "not a security event"})],
    ids=["plain", "keycloak-access", "events-not-an-object"],
)
def test_access_tokens_are_still_taken(live: Live, headers: dict[str, Any], claims: dict[str, Any]) -> None:
    r = post(live, live.idp.token("k1", headers=headers, **claims))
    assert r.status_code == 200 and "result" in r.json(), r.text[:300]
