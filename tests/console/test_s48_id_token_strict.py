"""The console read ID tokens with PyJWT's own JSON reader, access tokens with the gateway's strict one.
A signed ID token naming a claim twice (RFC 7519 §4: names MUST be unique) was read as its last copy, so
one token could show one subject, nonce or audience to whoever reads the first copy and another to the
gateway. It is refused now, like an access token with a claim twice.

The provider is the local one of test_issuer_slash.py: a discovery document and a JWKS with real keys."""

from __future__ import annotations

import asyncio
import json
import time

import jwt
import pytest

from gateway.admin.console.oidc import Provider, SignInError
from gateway.core.config import ConsoleConfig
from tests.auth.keys import IdP
from tests.console.test_issuer_slash import CLIENT, Discovery
from tests.console.test_s47_auth_time import attempt


def raw_signed(idp: IdP, payload: str) -> str:
    alg, key = idp.keys["k1"]
    return jwt.api_jws.encode(payload.encode(), key, algorithm=alg, headers={"kid": "k1"})


@pytest.mark.parametrize("twice", ["sub", "nonce", "aud", "auth_time"])
def test_an_id_token_naming_a_claim_twice_is_refused(twice: str) -> None:
    idp = IdP()
    idp.add("RS256", kid="k1")
    d = Discovery(idp)

    async def scenario() -> None:
        d.issuer = d.base + "/realm"
        p = Provider(ConsoleConfig(enabled=True, issuer=d.issuer, client_id=CLIENT))
        now = int(time.time())
        claims = {"iss": d.issuer, "aud": CLIENT, "sub": "alice", "iat": now, "exp": now + 300}
        claims |= {"nonce": "nonce-1", "auth_time": now - 5}
        body = json.dumps(claims)
        # the same token, well formed, signs in: what is refused below is only the second copy
        assert (await p.verify_id_token(raw_signed(idp, body), attempt()))["sub"] == "alice"
        second = {"sub": "mallory", "nonce": "nonce-1", "aud": CLIENT, "auth_time": now - 1}[twice]
        doubled = body[:-1] + f", {json.dumps(twice)}: {json.dumps(second)}}}"
        with pytest.raises(SignInError, match="appears more than once"):
            await p.verify_id_token(raw_signed(idp, doubled), attempt())

    asyncio.run(d.run(scenario))
