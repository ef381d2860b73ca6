"""The ID token's `auth_time` is what step-up measures a sign-in's age by: the session keeps it, and
every vote's policy question compares it with the request's limit. One later than now (a provider's
clock ahead, a token minted so), or no finite number at all (JSON as PyJWT reads it takes `Infinity`
and `NaN`), made every step-up limit pass for the session's whole life (8 hours by default), or failed
later pages with a 500. Such a sign-in is refused (NaN and Infinity, since stop 48, as a token that is
not JSON: ID tokens are read as strictly as access tokens); a time within the leeway still signs in.

The provider is the local one of test_issuer_slash.py: a discovery document and a JWKS with real keys."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import jwt
import pytest

from gateway.admin.console.oidc import LEEWAY, Login, Provider, SignInError, pkce_pair
from gateway.core.config import ConsoleConfig
from tests.auth.keys import IdP
from tests.console.test_issuer_slash import CLIENT, Discovery


def attempt(max_age: int | None = None) -> Login:
    return Login("state-1", "nonce-1", pkce_pair()[0], "/admin/approvals", max_age)


def signed(idp: IdP, iss: str, auth_time: Any) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": iss,
        "aud": CLIENT,
        "sub": "alice",
        "iat": now,
        "exp": now + 300,
        "nonce": "nonce-1",
    }
    if isinstance(auth_time, float) and not math.isfinite(auth_time):
        # jwt.encode writes NaN and Infinity as JSON's extensions, which json.loads (and PyJWT) read back
        alg, key = idp.keys["k1"]
        payload = json.dumps({**claims, "auth_time": auth_time}).encode()
        return jwt.api_jws.encode(payload, key, algorithm=alg, headers={"kid": "k1"})
    return idp.token("k1", **claims, auth_time=auth_time, nbf=None, realm_access=None, groups=None, scope=None)


@pytest.fixture
def idp() -> IdP:
    p = IdP()
    p.add("RS256", kid="k1")
    return p


@pytest.mark.parametrize("max_age", [None, 300])
def test_an_auth_time_in_the_future_or_no_finite_number_is_refused(idp: IdP, max_age: int | None) -> None:
    d = Discovery(idp)

    async def scenario() -> None:
        d.issuer = d.base + "/realm"
        p = Provider(ConsoleConfig(enabled=True, issuer=d.issuer, client_id=CLIENT))
        now = time.time()
        # 10**400: an int no float holds (math.isfinite raised OverflowError: a 500 at the callback)
        for bad in (int(now) + 3600, int(now) + 10 * LEEWAY, 10**400):
            with pytest.raises(SignInError, match="auth_time"):
                await p.verify_id_token(signed(idp, d.issuer, bad), attempt(max_age))
        # NaN and Infinity are no JSON: the whole token is refused before any claim is read
        for bad in (float("inf"), float("nan"), float("-inf")):
            with pytest.raises(SignInError, match="not JSON"):
                await p.verify_id_token(signed(idp, d.issuer, bad), attempt(max_age))
        # a provider's clock a little ahead, within the leeway, and a sign-in just now, are fine
        for good in (int(now) + LEEWAY // 2, int(now) - 5):
            claims = await p.verify_id_token(signed(idp, d.issuer, good), attempt(max_age))
            assert claims["auth_time"] == good

    asyncio.run(d.run(scenario))
