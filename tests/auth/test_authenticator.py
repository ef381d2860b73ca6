"""Token verification against real keys: every way a token can be wrong is refused, with the reason."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jwt
import pytest

from gateway.auth.jwks import JwksKeys
from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig, SecretRef
from tests.auth.keys import AUDIENCE, ISSUER, IdP, alg_none, claims_for

HS_SECRET = "an-hs256-service-secret-of-decent-length-0123456789"


@pytest.fixture
def idp() -> IdP:
    p = IdP()
    for alg in ("RS256", "ES256", "EdDSA"):
        p.add(alg, kid=alg.lower())
    return p


def make_auth(tmp_path: Path, idp: IdP, **kw: object) -> Authenticator:
    secret = tmp_path / "hs"
    secret.write_text(HS_SECRET)
    fields: dict[str, object] = {
        "hs256_secret": SecretRef(file=secret),
        "jwks_file": idp.write(tmp_path / "jwks.json"),
        "algorithms": ("RS256", "ES256", "EdDSA", "HS256"),
        "roles_claim": "realm_access.roles",
        **kw,
    }
    cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, **fields)  # type: ignore[arg-type]
    return Authenticator(cfg)


def run(auth: Authenticator, token: str) -> object:
    return asyncio.run(auth.authenticate(f"Bearer {token}"))


def refused(auth: Authenticator, token: str) -> AuthError:
    with pytest.raises(AuthError) as info:
        run(auth, token)
    return info.value


@pytest.mark.parametrize("kid", ["rs256", "es256", "eddsa"])
def test_idp_tokens_verify_and_claim_paths_apply(tmp_path: Path, idp: IdP, kid: str) -> None:
    p = run(make_auth(tmp_path, idp), idp.token(kid))
    assert p.sub == "idp-agent" and p.roles == ("operator",) and p.groups == ("sre",)  # type: ignore[attr-defined]


def test_hs256_service_token_verifies(tmp_path: Path, idp: IdP) -> None:
    token = jwt.encode(claims_for(), HS_SECRET, algorithm="HS256")
    assert run(make_auth(tmp_path, idp), token).sub == "idp-agent"  # type: ignore[attr-defined]


# Times relative to when the test runs, not to when it was collected: a whole suite runs for longer
# than these offsets, and a token "not yet valid" at collection is valid ten minutes later.
@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        (lambda now: {"exp": now - 120}, "expired"),
        (lambda now: {"aud": "https://someone-else/mcp"}, "audience"),
        (lambda now: {"iss": "https://evil.example"}, "issuer"),
        (lambda now: {"nbf": now + 600}, "not yet valid"),
        (lambda now: {"iat": now + 600}, "not yet valid"),
        (lambda now: {"exp": None}, "'exp'"),
        (lambda now: {"aud": None}, "'aud'"),
    ],
    ids=["exp", "aud", "iss", "nbf", "iat", "no-exp", "no-aud"],
)
def test_bad_claims_are_refused(
    tmp_path: Path, idp: IdP, claims: Callable[[int], dict[str, object]], reason: str
) -> None:
    err = refused(make_auth(tmp_path, idp), idp.token("rs256", **claims(int(time.time()))))
    assert err.status == 401 and err.error == "invalid_token" and reason in str(err)


def signed_payload(payload: bytes) -> str:
    """An HS256 token over exactly these payload bytes (what a careless or hostile issuer signs)."""
    return jwt.api_jws.encode(payload, HS_SECRET, algorithm="HS256")


def numeric_date_payload(name: str) -> str:
    """The case's payload, made when the test runs (its valid claims expire: see above)."""
    now = int(time.time())
    # the valid claims with one replaced by the case's literal: a claim named twice is refused as such (below)
    claims = claims_for()
    cases = {
        "exp_huge": ("exp", str(10**400)),  # a 500 before: float() overflowed
        "exp_string": ("exp", f'"{now + 600}"'),  # PyJWT's int() took it
        "exp_overflowing_float": ("exp", "1e400"),
        "exp_infinity": ("exp", "Infinity"),
        "exp_nan": ("exp", "NaN"),
        "exp_bool": ("exp", "true"),
        "exp_negative": ("exp", "-1"),
        "exp_after_year_9999": ("exp", "253402300800"),
        "iat_string": ("iat", f'"{now}"'),
        "nbf_huge": ("nbf", str(10**400)),
        "nbf_null": ("nbf", "null"),
    }
    claim, value = cases[name]
    claims[claim] = "@value@"
    return json.dumps(claims).replace('"@value@"', value)


NUMERIC_DATE_CASES = [
    "exp_huge", "exp_string", "exp_overflowing_float", "exp_infinity", "exp_nan", "exp_bool", "exp_negative",
    "exp_after_year_9999", "iat_string", "nbf_huge", "nbf_null",
]  # fmt: skip


@pytest.mark.parametrize("name", NUMERIC_DATE_CASES)
def test_time_claims_must_be_numbers_in_range(tmp_path: Path, idp: IdP, name: str) -> None:
    """Signed, so only the claims are at fault: each is a clear 401, never a 500 nor accepted."""
    payload = numeric_date_payload(name)
    err = refused(make_auth(tmp_path, idp), signed_payload(payload.encode()))
    assert err.status == 401 and err.error == "invalid_token", (name, err)
    claim = name.split("_", 1)[0]
    assert f"token {claim} claim must be a number" in str(err) or "is not JSON" in str(err), (name, str(err))


def test_time_claims_at_their_edges_are_accepted(tmp_path: Path, idp: IdP) -> None:
    body = json.dumps({**claims_for(), "exp": 253402300799, "nbf": 0})
    assert run(make_auth(tmp_path, idp), signed_payload(body.encode()))
    fraction = json.dumps({**claims_for(), "exp": time.time() + 600.5})  # RFC 7519 NumericDate: a fraction is fine
    assert run(make_auth(tmp_path, idp), signed_payload(fraction.encode()))


@pytest.mark.parametrize("value", ["1e400", "-1E999", "NaN", "[Infinity]"])
def test_a_number_json_cannot_carry_is_refused_in_any_claim(tmp_path: Path, idp: IdP, value: str) -> None:
    """Not only the time claims: 1e400 in any claim read as inf and reached the principal (and OPA's input)."""
    body = json.dumps(claims_for())[:-1] + f', "department": {value}' + "}"
    err = refused(make_auth(tmp_path, idp), signed_payload(body.encode()))
    assert err.status == 401 and err.error == "invalid_token", err
    assert "token payload is not JSON" in str(err), str(err)


@pytest.mark.parametrize("claim", ["sub", "roles", "aud", "exp", "department"])
def test_a_claim_named_twice_is_refused(tmp_path: Path, idp: IdP, claim: str) -> None:
    """RFC 7519 §4: claim names MUST be unique, a parser MUST refuse a duplicate or take the last one. The
    last was taken: an issuer signing two `sub` (or two `roles`) meant one of them, and which is not ours to
    guess. Both copies valid on their own, so only the duplicate is at fault."""
    claims = claims_for()
    if claim not in claims:
        claims[claim] = "ops"
    second = {
        "sub": '"someone-else"',
        "roles": '["admin"]',
        "aud": json.dumps(AUDIENCE),
        "exp": str(int(time.time()) + 60),
    }
    value = second.get(claim, '"dev"')
    body = json.dumps(claims)[:-1] + f', "{claim}": {value}' + "}"
    err = refused(make_auth(tmp_path, idp), signed_payload(body.encode()))
    assert err.status == 401 and err.error == "invalid_token", err
    assert f'the name "{claim}" appears more than once' in str(err), str(err)


def test_small_leeway_tolerates_clock_skew(tmp_path: Path, idp: IdP) -> None:
    token = idp.token("es256", exp=int(time.time()) - 5)
    assert run(make_auth(tmp_path, idp), token)


def test_alg_none_is_refused(tmp_path: Path, idp: IdP) -> None:
    err = refused(make_auth(tmp_path, idp), alg_none(claims_for()))
    assert "algorithm 'none' is not accepted" in str(err)


def test_hs_rs_confusion_is_refused(tmp_path: Path, idp: IdP) -> None:
    """HS256 signed with the RSA *public* key as the secret: verified only with the HS secret, so it fails."""
    _, key = idp.keys["rs256"]
    from cryptography.hazmat.primitives import serialization

    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    forged = jwt.api_jws.PyJWS()
    forged._algorithms["HS256"].prepare_key = lambda k: k  # bypass pyjwt's own PEM guard, as an attacker would
    token = forged.encode(json.dumps(claims_for()).encode(), pem, algorithm="HS256", headers={"kid": "rs256"})
    err = refused(make_auth(tmp_path, idp), token)
    assert "signature" in str(err)
    rs_only = make_auth(tmp_path, idp, hs256_secret=None, algorithms=("RS256",))
    assert "algorithm 'HS256' is not accepted" in str(refused(rs_only, token))


def test_unknown_kid_is_refused(tmp_path: Path, idp: IdP) -> None:
    stranger = IdP()
    stranger.add("RS256", kid="not-ours")
    err = refused(make_auth(tmp_path, idp), stranger.token("not-ours"))
    assert "unknown signing key 'not-ours'" in str(err)


def test_key_of_the_wrong_type_for_the_alg_is_refused(tmp_path: Path, idp: IdP) -> None:
    """A token claiming ES256 but naming the RSA key's kid: the key type decides, not the header."""
    _, ec_key = idp.keys["es256"]
    token = jwt.encode(claims_for(), ec_key, algorithm="ES256", headers={"kid": "rs256"})
    assert "cannot verify ES256" in str(refused(make_auth(tmp_path, idp), token))


def test_tampered_signature_and_payload_are_refused(tmp_path: Path, idp: IdP) -> None:
    auth = make_auth(tmp_path, idp)
    head, body, sig = idp.token("rs256").split(".")
    flipped = sig[:-4] + ("AAAA" if sig[-4:] != "AAAA" else "BBBB")
    assert "signature" in str(refused(auth, f"{head}.{body}.{flipped}"))
    other = jwt.utils.base64url_encode(json.dumps(claims_for(sub="root")).encode()).decode()
    assert "signature" in str(refused(auth, f"{head}.{other}.{sig}"))


def test_missing_scope_is_403_insufficient_scope(tmp_path: Path, idp: IdP) -> None:
    auth = make_auth(tmp_path, idp, required_scopes=("pvegate:tools",))
    err = refused(auth, idp.token("rs256", scope="openid"))
    assert (err.status, err.error, err.scope) == (403, "insufficient_scope", ("pvegate:tools",))
    assert run(auth, idp.token("rs256"))


def test_malformed_headers_are_invalid_request(tmp_path: Path, idp: IdP) -> None:
    auth = make_auth(tmp_path, idp)
    for header in (None, "", "Basic abc", "Bearer ", "Bearer not-a-jwt"):
        with pytest.raises(AuthError) as info:
            asyncio.run(auth.authenticate(header))
        assert info.value.status == 401


def test_jwks_file_rotation_is_picked_up(tmp_path: Path, idp: IdP) -> None:
    auth = make_auth(tmp_path, idp)
    assert run(auth, idp.token("rs256"))
    new_kid = idp.add("RS256", kid="rs256-2026")
    del idp.keys["rs256"]
    idp.write(tmp_path / "jwks.json")
    os.utime(tmp_path / "jwks.json", (time.time() + 1, time.time() + 1))  # mtime granularity
    assert run(auth, idp.token(new_kid)).sub == "idp-agent"  # type: ignore[attr-defined]


class _JwksServer:
    def __init__(self, idp: IdP) -> None:
        self.idp = idp
        self.fetches = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                body = json.dumps(outer.idp.jwks()).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def jwks_server(idp: IdP) -> Iterator[_JwksServer]:
    s = _JwksServer(idp)
    yield s
    s.server.shutdown()


def test_jwks_url_caches_and_rotates_on_unknown_kid(jwks_server: _JwksServer, idp: IdP) -> None:
    cfg = AuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url=jwks_server.url, algorithms=("RS256", "EdDSA"))
    keys = JwksKeys(url=jwks_server.url, min_refresh_seconds=0.5)
    auth = Authenticator(cfg, jwks=keys)

    async def scenario() -> None:
        for _ in range(5):
            await auth.authenticate(f"Bearer {idp.token('rs256')}")
        assert jwks_server.fetches == 1  # cached
        kid = idp.add("EdDSA", kid="rotated")  # the IdP rotates in a new key
        await asyncio.sleep(0.6)
        assert (await auth.authenticate(f"Bearer {idp.token(kid)}")).sub == "idp-agent"
        assert jwks_server.fetches == 2
        stranger = IdP()
        stranger.add("RS256", kid="forged")
        for _ in range(20):  # a flood of unknown kids costs at most one fetch per interval
            with pytest.raises(AuthError):
                await auth.authenticate(f"Bearer {stranger.token('forged')}")
        assert jwks_server.fetches <= 3

    asyncio.run(scenario())


def test_jwks_url_must_be_https_off_loopback() -> None:
    with pytest.raises(ValueError, match="https"):
        JwksKeys(url="http://idp.example.com/jwks.json")


def test_configuring_alg_none_is_rejected(tmp_path: Path, idp: IdP) -> None:
    with pytest.raises(ValueError):
        Authenticator(AuthConfig(issuer=ISSUER, audience=AUDIENCE, algorithms=("none",)))


def test_the_resource_url_is_an_accepted_audience_when_given(tmp_path: Path, idp: IdP) -> None:
    """RFC 8707: a client that asked for a token for this resource gets the resource URL as `aud`."""
    resource = "https://gw.example:8443/mcp"
    cfg = make_auth(tmp_path, idp).cfg
    with_resource = Authenticator(cfg, resource=resource)
    p = run(with_resource, idp.token("rs256", aud=resource))
    assert p.sub == "idp-agent"  # type: ignore[attr-defined]
    assert run(with_resource, idp.token("rs256", aud=["account", resource]))
    assert run(with_resource, idp.token("rs256"))  # auth.audience still works
    assert "audience" in str(refused(Authenticator(cfg), idp.token("rs256", aud=resource)))
    assert "audience" in str(refused(with_resource, idp.token("rs256", aud="https://gw.example:8443/other")))


def test_a_missing_credential_is_marked_as_such(tmp_path: Path, idp: IdP) -> None:
    auth = make_auth(tmp_path, idp)
    with pytest.raises(AuthError) as info:
        asyncio.run(auth.authenticate(None))
    assert info.value.credentials is False and info.value.status == 401
    assert refused(auth, "not-a-jwt").credentials is True
