"""The console's OpenID Connect client against the real Keycloak (tests/kcserver.py): discovery,
the authorization request, and ID tokens that must not open a session. The whole sign-in, through
Keycloak's login page, is test_browser.py's."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest

from gateway.admin.console.oidc import Login, Provider, SignInError, pkce_pair
from gateway.core.config import ConsoleConfig
from tests.kcserver import CONSOLE_CLIENT, TESTS_CLIENT


def provider(kc: Any, client_id: str = CONSOLE_CLIENT) -> Provider:
    return Provider(ConsoleConfig(enabled=True, issuer=kc.issuer, client_id=client_id))


def attempt(max_age: int | None = None) -> Login:
    return Login("state-1", "nonce-1", pkce_pair()[0], "/admin/approvals", max_age)


def id_token(kc: Any, username: str = "alice") -> str:
    """A real ID token of the realm (the test client's password grant: it carries no nonce)."""
    form = {
        "grant_type": "password",
        "client_id": TESTS_CLIENT,
        "username": username,
        "password": kc.users[username].password,
        "scope": "openid",
    }
    r = httpx.post(kc.token_url, data=form, timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["id_token"])


def test_the_authorization_request_asks_for_code_with_pkce(keycloak: Any) -> None:
    p = provider(keycloak)
    verifier, challenge = pkce_pair()
    assert len(verifier) >= 43 and challenge != verifier
    url = asyncio.run(p.authorize_url(attempt(max_age=60), "https://127.0.0.1:1/admin/callback", challenge))
    parts = urlsplit(url)
    assert url.startswith(keycloak.issuer + "/protocol/openid-connect/auth?")
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert q["response_type"] == "code" and q["client_id"] == CONSOLE_CLIENT
    assert q["code_challenge"] == challenge and q["code_challenge_method"] == "S256"
    assert q["state"] == "state-1" and q["nonce"] == "nonce-1" and q["max_age"] == "60"
    assert "openid" in q["scope"].split()


def test_a_code_keycloak_never_issued_is_refused(keycloak: Any) -> None:
    with pytest.raises(SignInError, match="refused the sign-in code"):
        asyncio.run(provider(keycloak).exchange("not-a-code", attempt(), "https://127.0.0.1:1/admin/callback"))


def test_id_tokens_that_must_not_sign_anyone_in(keycloak: Any) -> None:
    token = id_token(keycloak)
    # issued to another client: the audience is not the console's
    with pytest.raises(SignInError, match="does not verify"):
        asyncio.run(provider(keycloak).verify_id_token(token, attempt()))
    # the right client, but not issued for this browser's attempt (no nonce at all here)
    with pytest.raises(SignInError, match=r"not issued for this sign-in \(nonce\)"):
        asyncio.run(provider(keycloak, TESTS_CLIENT).verify_id_token(token, attempt()))
    # a signature that does not match the payload
    head, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "someone-else"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(SignInError, match="does not verify"):
        asyncio.run(provider(keycloak, TESTS_CLIENT).verify_id_token(f"{head}.{forged}.{sig}", attempt()))
    # a symmetric (or unsigned) token is never an ID token here, whatever its claims
    hs = jwt.encode({**claims, "nonce": "nonce-1"}, "x" * 32, algorithm="HS256")
    with pytest.raises(SignInError, match="algorithm 'HS256' is not accepted"):
        asyncio.run(provider(keycloak, TESTS_CLIENT).verify_id_token(hs, attempt()))
