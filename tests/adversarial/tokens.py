"""Forged, tampered and replayed bearer tokens for the adversarial corpus.

`authorization(variant, env, sub)` returns the Authorization header value(s) a
hostile client would send (None: no header; a list: several headers).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt

from gateway.dev.devenv import AUDIENCE, ISSUER, DevEnv

ATTACKER = "attacker-chosen-hmac-key-0123456789abcdef"


def _b64(doc: Any) -> str:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def claims(subject: str, **over: Any) -> dict[str, Any]:
    """A valid operator token's claims for `subject`, with overrides (None removes a claim)."""
    now = int(time.time())
    c: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": subject,
        "iat": now,
        "nbf": now,
        "exp": now + 600,
        "roles": ["operator"],
        "groups": [],
        "pvegate_kind": "agent",
    }
    c.update(over)
    return {k: v for k, v in c.items() if v is not None}


def sign(env: DevEnv, payload: dict[str, Any], headers: dict[str, Any] | None = None, alg: str = "HS256") -> str:
    return jwt.encode(payload, env.jwt_secret, algorithm=alg, headers=headers)


def hand_signed(env: DevEnv, payload: dict[str, Any]) -> str:
    """HS256 over bytes built by hand: pyjwt cannot encode every payload a client can send
    (json.dumps writes a lone surrogate as the escape \\ud800, which is valid JSON)."""
    signing_input = f"{_b64({'alg': 'HS256', 'typ': 'JWT'})}.{_b64(payload)}"
    mac = hmac.new(env.jwt_secret.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(mac)}"


def unsigned(payload: dict[str, Any], alg: str = "none") -> str:
    return f"{_b64({'alg': alg, 'typ': 'JWT'})}.{_b64(payload)}."


def authorization(variant: str, env: DevEnv, sub: str) -> str | list[str] | None:
    good = sign(env, claims(sub))
    admin_claims = claims(sub, roles=["admin"], groups=["pve-admins"], pvegate_kind="human")
    h, p, s = good.split(".")
    now = int(time.time())
    table: dict[str, Any] = {
        "none": None,
        "empty_bearer": "Bearer",
        "basic": "Basic " + base64.b64encode(b"root@pam:secret").decode(),
        "lowercase_scheme": "bearer " + unsigned(claims(sub)),
        "double_space": "Bearer  " + good + " x",
        "garbage": "Bearer not-a-jwt",
        "two_parts": f"Bearer {h}.{p}",
        "four_parts": f"Bearer {good}.{s}",
        "expired": "Bearer " + sign(env, claims(sub, iat=now - 7200, nbf=now - 7200, exp=now - 3600)),
        "expired_long_ago": "Bearer " + sign(env, claims(sub, iat=1_000_000_000, nbf=1_000_000_000, exp=1_000_003_600)),
        "nbf_future": "Bearer " + sign(env, claims(sub, nbf=now + 3600, exp=now + 7200)),
        "iat_future": "Bearer " + sign(env, claims(sub, iat=now + 3600, nbf=None, exp=now + 7200)),
        "wrong_secret": "Bearer " + jwt.encode(claims(sub), "not-the-secret-" * 4, algorithm="HS256"),
        "alg_none": "Bearer " + unsigned(claims(sub)),
        "alg_none_upper": "Bearer " + unsigned(claims(sub), "NONE"),
        "hs512": "Bearer " + sign(env, claims(sub), alg="HS512"),
        "rs256_header": "Bearer " + f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{p}.{s}",
        "es256_header": "Bearer " + f"{_b64({'alg': 'ES256', 'typ': 'JWT'})}.{p}.{s}",
        "wrong_aud": "Bearer " + sign(env, claims(sub, aud="some-other-service")),
        "aud_list_other": "Bearer " + sign(env, claims(sub, aud=["a", "b"])),
        "wrong_iss": "Bearer " + sign(env, claims(sub, iss="https://evil.example")),
        "no_sub": "Bearer " + sign(env, claims(sub, sub=None)),
        "empty_sub": "Bearer " + sign(env, claims("")),
        "sub_int": "Bearer " + sign(env, claims(sub, sub=12345)),
        "no_exp": "Bearer " + sign(env, claims(sub, exp=None)),
        # the operator's real signature over a payload that now claims admin
        "tampered_payload_admin": f"Bearer {h}.{_b64(admin_claims)}.{s}",
        "spliced_signature": f"Bearer {h}.{p}." + sign(env, claims("someone-else")).split(".")[2],
        "truncated_signature": f"Bearer {h}.{p}.{s[:-4]}",
        # key-location headers pointing at attacker material, signed with the attacker's key:
        # they must be ignored (never fetched, never trusted), so the signature fails
        "huge_token": "Bearer " + jwt.encode(claims(sub, pad="x" * 60_000), ATTACKER, algorithm="HS256"),
        "kid_path_traversal": "Bearer "
        + jwt.encode(claims(sub), ATTACKER, algorithm="HS256", headers={"kid": "../../../../etc/passwd"}),
        "jku_header": "Bearer "
        + jwt.encode(claims(sub), ATTACKER, algorithm="HS256", headers={"jku": "https://127.0.0.1:1/jwks.json"}),
        "x5u_header": "Bearer "
        + jwt.encode(claims(sub), ATTACKER, algorithm="HS256", headers={"x5u": "https://127.0.0.1:1/cert.pem"}),
        "jwk_embedded": "Bearer "
        + f"{_b64({'alg': 'HS256', 'jwk': {'kty': 'oct', 'k': _b64(ATTACKER.encode())}})}.{p}."
        + jwt.encode(claims(sub), ATTACKER, algorithm="HS256").split(".")[2],
        "crit_header": "Bearer " + sign(env, claims(sub), headers={"crit": ["exp"], "exp": 1}),
        "roles_string": "Bearer " + sign(env, claims(sub, roles="admin")),
        "unicode_sub": "Bearer " + sign(env, claims("\u0430dmin\u202e")),
        "token_in_query": None,  # the runner puts the token in ?access_token= instead
        "two_auth_headers": ["Bearer " + unsigned(claims(sub, roles=["admin"])), "Bearer " + good],
        "bearer_with_trailing_data": "Bearer " + good + ", Bearer " + good,
        # validly signed, but a claim is a lone surrogate: no principal can be built from it
        "surrogate_sub": "Bearer " + hand_signed(env, claims("adv-\ud800")),
        "surrogate_role": "Bearer " + hand_signed(env, claims(sub, roles=["operator", "\udfff"])),
        "surrogate_kid": "Bearer " + sign(env, claims(sub), headers={"kid": "\ud800"}),
        # an algorithm name outside Latin-1: echoed in WWW-Authenticate, it must not break the header
        "alg_non_latin1": "Bearer " + _b64({"alg": "\u65e5\u672c", "typ": "JWT"}) + f".{p}.{s}",
        "null_byte_token": "Bearer " + good[:20] + "\\u0000" + good[20:],
    }
    if variant not in table:
        raise KeyError(f"unknown token variant {variant!r}")
    value: str | list[str] | None = table[variant]
    return value
