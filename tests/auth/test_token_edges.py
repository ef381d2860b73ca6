"""Edges of token authentication: concurrent use of one cached token across a key-set change,
header values quoted in refusals, single-string role and group claims, and tokens that say
they are not access tokens."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import identity
from gateway.auth.jwks import JwksKeys
from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig
from tests.auth.keys import AUDIENCE, ISSUER, IdP
from tests.auth.test_jwks_fetch import Provider


@pytest.fixture
def idp() -> IdP:
    p = IdP()
    p.add("RS256", kid="k1")
    return p


def file_auth(idp: IdP, tmp_path: Path, **kw: Any) -> Authenticator:
    fields: dict[str, Any] = {"algorithms": ("RS256",), "roles_claim": "realm_access.roles", **kw}
    cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_file=idp.write(tmp_path / "jwks.json"), **fields)
    return Authenticator(cfg)


def refusal(auth: Authenticator, token: str) -> AuthError:
    with pytest.raises(AuthError) as info:
        asyncio.run(auth.authenticate(f"Bearer {token}"))
    return info.value


def b64(doc: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def test_one_cached_token_used_concurrently_across_a_key_set_change(idp: IdP) -> None:
    """h1_cache_race: requests with the same cached token wait together for a key-set fetch that
    brings a changed set; each of them is answered (no KeyError, no 500)."""

    async def scenario() -> list[Any]:
        provider = Provider(idp)
        async with provider as url:
            keys = JwksKeys(url=url, cache_seconds=0.3, min_refresh_seconds=0.0)
            keys.max_stale_seconds = 0.0  # past the bound at once: the cache hits wait for the fetch
            cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=url, algorithms=("RS256",))
            auth = Authenticator(cfg, jwks=keys)
            token = idp.token("k1")
            await auth.authenticate(f"Bearer {token}")
            await asyncio.sleep(0.4)  # stale
            idp.add("RS256", kid="k2")  # the provider adds a key: a new generation
            provider.delay = 0.3
            out = await asyncio.gather(
                *(auth.authenticate(f"Bearer {token}") for _ in range(5)), return_exceptions=True
            )
            assert len(auth._verified) == 1
            return out

    out = asyncio.run(scenario())
    assert [getattr(p, "sub", p) for p in out] == ["idp-agent"] * 5


@pytest.mark.parametrize(
    "header",
    [
        {"alg": "X" * 12000},
        {"alg": "RS256", "kid": "K" * 12000},
        {"alg": {"nested": ["a" * 50] * 100}},
        {"alg": ["RS256"] * 2000},
    ],
    ids=["long-alg", "long-kid", "object-alg", "list-alg"],
)
def test_header_values_are_quoted_short(idp: IdP, tmp_path: Path, header: dict[str, Any]) -> None:
    """h4_echo: what a token's header says reaches the reply, WWW-Authenticate and the audit cut short."""
    err = refusal(file_auth(idp, tmp_path), b64(header) + "." + b64({}) + ".AAAA")
    assert len(str(err)) < 120, str(err)
    assert "not accepted" in str(err) or "unknown signing key" in str(err)


def test_a_single_string_role_or_group_is_one_value(tmp_path: Path) -> None:
    """h5_strings: only the scope claim is a space-separated list; a string role or group is one
    name, spaces and all (`/Domain Users`), and cannot smuggle a second (`x sre-leads`)."""
    cfg = AuthConfig(
        issuer=ISSUER,
        audience=AUDIENCE,
        jwks_file=tmp_path / "unused.json",
        algorithms=("RS256",),
        roles_claim=("roles", "realm_access.roles"),
    )
    claims = {"iss": ISSUER, "sub": "u1", "roles": "viewer approver", "groups": "/Domain Users /sre-leads"}
    p = identity.principal(claims, cfg, ())
    assert p.roles == ("viewer approver",) and p.groups == ("Domain Users /sre-leads",)
    assert identity.principal({**claims, "roles": "", "groups": ""}, cfg, ()).groups == ()
    assert identity.principal({**claims, "groups": ["/a b", "/c"]}, cfg, ()).groups == ("a b", "c")
    assert identity.strings("pvegate:tools  openid", "scope", split=True) == ("pvegate:tools", "openid")


def test_a_string_scope_is_still_split(idp: IdP, tmp_path: Path) -> None:
    auth = file_auth(idp, tmp_path, required_scopes=("pvegate:tools",), groups_claim=("groups",))
    p = asyncio.run(auth.authenticate(f"Bearer {idp.token('k1', scope='openid pvegate:tools', groups='x sre-leads')}"))
    assert p.scopes == ("openid", "pvegate:tools") and p.groups == ("x sre-leads",)


@pytest.mark.parametrize(
    ("headers", "claims", "reason"),
    [
        ({}, {"typ": "ID"}, "an ID token"),  # Keycloak's ID token
        ({"typ": "id_token+jwt"}, {}, "an ID token"),
        ({"typ": "application/id_token+jwt"}, {}, "an ID token"),
        ({"typ": "logout+jwt"}, {}, "a logout token"),
    ],
)
def test_tokens_that_say_they_are_not_access_tokens_are_refused(
    idp: IdP, tmp_path: Path, headers: dict[str, Any], claims: dict[str, Any], reason: str
) -> None:
    err = refusal(file_auth(idp, tmp_path), idp.token("k1", headers=headers, **claims))
    assert str(err) == f"token is {reason}, not an access token" and err.status == 401


@pytest.mark.parametrize(
    ("headers", "claims"),
    [
        ({}, {}),  # says nothing
        ({"typ": "JWT"}, {"typ": "Bearer"}),  # Keycloak's access token
        ({"typ": "at+jwt"}, {}),  # RFC 9068
        ({"typ": "application/at+jwt"}, {}),
    ],
)
def test_access_tokens_and_tokens_that_say_nothing_are_taken(
    idp: IdP, tmp_path: Path, headers: dict[str, Any], claims: dict[str, Any]
) -> None:
    auth = file_auth(idp, tmp_path)
    assert asyncio.run(auth.authenticate(f"Bearer {idp.token('k1', headers=headers, **claims)}")).sub == "idp-agent"
