"""The verified-token cache: a token verified once is not verified again on every call, but the
cache never outlives the token's exp, a change of the key set, or its size bound."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig, SecretRef
from gateway.core.principal import Principal
from tests.auth.keys import AUDIENCE, ISSUER, IdP
from tests.auth.test_authenticator import HS_SECRET


class CountingAuthenticator(Authenticator):
    """The real authenticator, counting full verifications (signature and claims)."""

    verifications = 0

    async def _verify(self, token: str) -> tuple[Principal, float | None, str]:
        self.verifications += 1
        return await super()._verify(token)


@pytest.fixture
def idp() -> IdP:
    p = IdP()
    p.add("RS256", kid="rs256")
    return p


def make(tmp_path: Path, idp: IdP) -> CountingAuthenticator:
    secret = tmp_path / "hs"
    secret.write_text(HS_SECRET)
    cfg = AuthConfig(
        issuer=ISSUER,
        audience=AUDIENCE,
        hs256_secret=SecretRef(file=secret),
        jwks_file=idp.write(tmp_path / "jwks.json"),
        algorithms=("RS256", "HS256"),
        roles_claim="realm_access.roles",
        leeway_seconds=30,
    )
    return CountingAuthenticator(cfg)


def auth_many(auth: Authenticator, tokens: list[str]) -> list[Any]:
    async def go() -> list[Any]:
        out: list[Any] = []
        for t in tokens:
            try:
                out.append(await auth.authenticate(f"Bearer {t}"))
            except AuthError as exc:
                out.append(exc)
        return out

    return asyncio.run(go())


def hs_token(**claims: Any) -> str:
    now = int(time.time())
    doc = {"iss": ISSUER, "aud": AUDIENCE, "sub": "svc", "iat": now, "exp": now + 600, **claims}
    return jwt.encode(doc, HS_SECRET, algorithm="HS256")


def test_a_token_is_verified_once_then_reused(tmp_path: Path, idp: IdP) -> None:
    auth = make(tmp_path, idp)
    token = idp.token("rs256")
    first, *rest = auth_many(auth, [token] * 20)
    assert isinstance(first, Principal) and first.sub == "idp-agent"
    assert all(p == first for p in rest)
    assert auth.verifications == 1
    # a different token is verified on its own
    other = idp.token("rs256", sub="someone-else")
    (p,) = auth_many(auth, [other])
    assert p.sub == "someone-else" and auth.verifications == 2


def test_cache_never_outlives_exp(tmp_path: Path, idp: IdP) -> None:
    """exp two seconds ahead: reused before it, refused after it (the leeway of 30 s would have
    accepted it in a fresh verification, so only a real verification can refuse it here)."""
    auth = make(tmp_path, idp)
    auth.cfg = auth.cfg.__class__(**{**auth.cfg.__dict__, "leeway_seconds": 0})
    exp = int(time.time()) + 2
    token = hs_token(exp=exp)
    assert isinstance(auth_many(auth, [token, token])[1], Principal) and auth.verifications == 1
    time.sleep(max(0.0, exp - time.time()) + 0.2)
    (after,) = auth_many(auth, [token])
    assert isinstance(after, AuthError) and str(after) == "token expired"
    assert auth.verifications == 2  # verified again, not served from the cache


def test_cache_never_outlives_a_key_rotation(tmp_path: Path, idp: IdP) -> None:
    """The IdP drops the key a cached token was signed with: the token is refused at once."""
    auth = make(tmp_path, idp)
    token = idp.token("rs256")
    assert isinstance(auth_many(auth, [token, token])[1], Principal) and auth.verifications == 1
    idp.add("RS256", kid="rs256-2026")
    del idp.keys["rs256"]
    idp.write(tmp_path / "jwks.json")
    os.utime(tmp_path / "jwks.json", (time.time() + 1, time.time() + 1))  # mtime granularity
    (after,) = auth_many(auth, [token])
    assert isinstance(after, AuthError) and "unknown signing key" in str(after)
    assert not auth._verified  # dropped, not kept for later


def test_cache_is_bounded(tmp_path: Path, idp: IdP) -> None:
    auth = make(tmp_path, idp)
    auth.cache_size = 8
    tokens = [hs_token(sub=f"svc-{i}") for i in range(20)]
    auth_many(auth, tokens)
    assert len(auth._verified) == 8
    # the most recent are kept: the last one is served from the cache, the first verified again
    before = auth.verifications
    auth_many(auth, [tokens[-1]])
    assert auth.verifications == before
    auth_many(auth, [tokens[0]])
    assert auth.verifications == before + 1


def test_refusals_are_not_cached(tmp_path: Path, idp: IdP) -> None:
    auth = make(tmp_path, idp)
    bad = idp.token("rs256", aud="someone-else")
    out = auth_many(auth, [bad, bad])
    assert all(isinstance(e, AuthError) for e in out) and auth.verifications == 2
    assert not auth._verified
