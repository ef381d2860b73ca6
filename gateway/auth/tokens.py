"""Bearer JWT authentication: a token in, a Principal out (or an AuthError).

The accepted algorithms come from configuration, never from the token header.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict
from typing import Any, NamedTuple

import jwt

from gateway.auth import identity
from gateway.auth.jwks import ALG_KEY_TYPES, JwksKeys, KeyUnavailable, shown
from gateway.core import jsonread
from gateway.core.config import AuthConfig
from gateway.core.principal import Principal
from gateway.core.text import describe, unencodable_path


class AuthError(Exception):
    """Authentication failed; `error` is the RFC 6750 error code."""

    def __init__(
        self,
        message: str,
        error: str = "invalid_token",
        status: int = 401,
        scope: tuple[str, ...] = (),
        credentials: bool = True,
    ) -> None:
        super().__init__(message)
        self.error = error
        self.status = status
        self.scope = scope  # for insufficient_scope: what the resource requires
        # False: the request carried no credentials at all; its challenge then names no error
        # code (RFC 6750 §3.1), which is how a client learns it must go and get a token
        self.credentials = credentials


def _check_text(doc: dict[str, Any], part: str) -> None:
    """A string that is not valid Unicode (a lone surrogate) in a token is refused, not carried
    into the principal: it could be neither audited nor decided on."""
    if (where := unencodable_path(doc)) is not None:
        raise AuthError(f"token {part} {describe(where)} is not valid Unicode text")


# NumericDate claims (RFC 7519 §2) taken: seconds from 1970 to the end of year 9999. PyJWT would
# take "1700000000" (a string) through int(), and a signed exp of 10**400 overflowed float() into a 500.
NUMERIC_DATE_CLAIMS = ("exp", "iat", "nbf")
MAX_NUMERIC_DATE = 253402300799  # 9999-12-31T23:59:59Z


# Tokens that say they are not access tokens: an OpenID Connect ID token (Keycloak's payload
# `typ: ID`) or logout token proves a sign-in to a client, a refresh token is for the provider's
# token endpoint only; none grants access to this resource, even when its `aud` happens to be
# auth.audience. A token that says nothing is taken.
PAYLOAD_TYPES = {  # Keycloak's payload `typ` ("Bearer" in access tokens)
    "id": "an ID token",
    "logout": "a logout token",  # its back-channel logout token
    "refresh": "a refresh token",
    "offline": "a refresh token",  # an offline token is a refresh token
}
HEADER_TYPES = {  # explicit typing (RFC 8725 §3.11), with or without "application/"
    "id_token+jwt": "an ID token",
    "logout+jwt": "a logout token",
    "secevent+jwt": "a security event token",  # RFC 8417 §2.3 (a logout token is one)
}
# what makes a token an OpenID Connect Back-Channel Logout token (§2.4), whatever its `typ` says
BACKCHANNEL_LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"


def _declared_not_access(header_typ: Any, payload: dict[str, Any] | None = None) -> str | None:
    """Which kind of token the header `typ`, or the payload's `typ` or `events`, says this is, when
    that is not an access token."""
    if isinstance(header_typ, str):
        media = header_typ.lower().removeprefix("application/")
        for suffix, what in HEADER_TYPES.items():
            if media.endswith(suffix):
                return what
    if payload is None:
        return None
    payload_typ = payload.get("typ")
    if isinstance(payload_typ, str) and payload_typ.lower() in PAYLOAD_TYPES:
        return PAYLOAD_TYPES[payload_typ.lower()]
    events = payload.get("events")
    if isinstance(events, dict) and BACKCHANNEL_LOGOUT_EVENT in events:
        return "a logout token"
    return None


class ClaimTypeError(jwt.DecodeError):
    """A time claim that is not a NumericDate we take, or a payload with NaN/Infinity."""


class StrictJWT(jwt.PyJWT):
    """PyJWT with the payload held to JSON and the time claims to numbers in range; checked
    after the signature (the payload is decoded only then) and before PyJWT reads the claims."""

    def _decode_payload(self, decoded: dict[str, Any]) -> dict[str, Any]:
        raw = decoded["payload"]
        try:
            # a claim named twice (RFC 7519 §4: names MUST be unique) is refused, not read as its last copy
            payload = jsonread.loads(raw.decode() if isinstance(raw, bytes) else raw, unique_names=True)
        except jsonread.NotJson as exc:  # NaN, Infinity or 1e400 in any claim: never passed on to OPA
            raise ClaimTypeError(f"token payload is not JSON: {exc}") from exc
        except ValueError as exc:  # as PyJWT's own _decode_payload (UTF-8 is RFC 7519's encoding)
            raise jwt.DecodeError(f"Invalid payload string: {exc}") from exc
        if not isinstance(payload, dict):
            raise jwt.DecodeError("Invalid payload string: must be a json object")
        for name in NUMERIC_DATE_CLAIMS:
            if name not in payload:
                continue  # a missing required one is PyJWT's to name
            value = payload[name]
            # RFC 7519 allows a fraction; 1e400 parses as inf and fails the range
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_NUMERIC_DATE:
                raise ClaimTypeError(f"token {name} claim must be a number (seconds since 1970, before year 10000)")
        return payload


# every token the gateway verifies goes through this: access tokens here, ID tokens in the console
STRICT_JWT = StrictJWT()


# how many verified tokens are remembered (the most recently used); a token is verified again
# after its exp or a change of the key set, whichever comes first
VERIFIED_CACHE_SIZE = 1024


class _Verified(NamedTuple):
    principal: Principal
    exp: float  # the token's exp claim: never used at or after it (the leeway is not extended)
    generation: int | None  # the key set's generation it was verified against (None: the HS256 secret)


class Authenticator:
    """Verifies bearer tokens against the configured keys, issuer and audience.

    The algorithm set is configuration; each algorithm has exactly one key source
    (HS256: the shared secret; RS/ES/EdDSA: the JWKS, matched by kid and key
    type), so a token cannot steer which key verifies it (no alg:none, no HS/RS
    confusion).
    """

    def __init__(self, cfg: AuthConfig, jwks: JwksKeys | None = None, resource: str | None = None) -> None:
        self.cfg = cfg
        # A client that asked its authorization server for a token for this resource (RFC 8707
        # resource indicator) gets the resource URL as `aud`: accepted beside auth.audience.
        self.audiences = [cfg.audience] + ([resource] if resource and resource != cfg.audience else [])
        self._hs_secret = cfg.hs256_secret.read() if cfg.hs256_secret else None
        if jwks is None and (cfg.jwks_url or cfg.jwks_file):
            jwks = JwksKeys(
                url=cfg.jwks_url,
                file=cfg.jwks_file,
                cache_seconds=float(cfg.jwks_cache_seconds),
                algorithms=tuple(cfg.algorithms),
            )
        self.jwks = jwks
        # sha256(token) -> what verifying it gave: a signature check, claim checks and a Principal
        # per call cost ~0.2 ms; agents send the same token until it expires
        self._verified: OrderedDict[bytes, _Verified] = OrderedDict()
        self.cache_size = VERIFIED_CACHE_SIZE
        unknown = [a for a in cfg.algorithms if a != "HS256" and a not in ALG_KEY_TYPES]
        if unknown or "none" in (a.lower() for a in cfg.algorithms):
            raise ValueError(f"unsupported JWT algorithms in configuration: {unknown or ['none']}")

    async def _key_for(self, token: str) -> tuple[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise AuthError("malformed token") from exc
        _check_text(header, "header")
        if (what := _declared_not_access(header.get("typ"))) is not None:
            raise AuthError(f"token is {what}, not an access token")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.cfg.algorithms:
            raise AuthError(f"token algorithm {shown(alg)} is not accepted")  # cut: the sender chose it
        if alg == "HS256":
            if not self._hs_secret:
                raise AuthError("HS256 tokens are not accepted")
            return alg, self._hs_secret
        if self.jwks is None:
            raise AuthError(f"no key configured for algorithm {alg!r}")
        kid = header.get("kid")
        try:
            return alg, await self.jwks.key_for(kid if isinstance(kid, str) else None, alg)
        except KeyUnavailable as exc:
            raise AuthError(str(exc)) from exc

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise AuthError("missing bearer token", error="invalid_request", credentials=False)
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("authorization must be a bearer token", error="invalid_request")
        token = token.strip()
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        hit = self._verified.get(digest)
        if hit is not None:
            # a changed key set (a file that changed, a background refresh that ended) drops the
            # entry; a stale one is refreshed in the background meanwhile (the HS256 secret is read once)
            generation = None if hit.generation is None else await self._key_generation()
            # other requests with this token ran during the await: they may have dropped or replaced it
            hit = self._verified.get(digest)
            if hit is not None and hit.generation == generation and time.time() < hit.exp:
                self._verified.move_to_end(digest)  # no await since the look-up: still there
                return hit.principal
            self._verified.pop(digest, None)
        principal, exp, alg = await self._verify(token)
        # no await since _verify took its key: this is the generation of the set that key came from
        generation = None if alg == "HS256" or self.jwks is None else self.jwks.generation
        if exp is not None and time.time() < exp:
            self._verified[digest] = _Verified(principal, exp, generation)
            if len(self._verified) > self.cache_size:
                self._verified.popitem(last=False)
        return principal

    async def _key_generation(self) -> int | None:
        if self.jwks is None:
            return None
        return await self.jwks.ready()  # waits on the provider only past the staleness bound

    async def _verify(self, token: str) -> tuple[Principal, float | None, str]:
        """Verify the token: the Principal, its exp (None when not a number), the algorithm."""
        alg, key = await self._key_for(token)
        try:
            claims: dict[str, Any] = STRICT_JWT.decode(
                token,
                key=key,
                algorithms=[alg],  # the one configured algorithm this key serves
                audience=self.audiences,
                issuer=self.cfg.issuer,
                leeway=self.cfg.leeway_seconds,
                options={"require": ["exp", "iat", "sub", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise AuthError("token expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise AuthError("token not yet valid (nbf/iat in the future)") from exc
        except jwt.InvalidAudienceError as exc:
            raise AuthError("token audience is not this gateway") from exc
        except jwt.InvalidIssuerError as exc:
            raise AuthError("token issuer is not trusted") from exc
        except jwt.InvalidSignatureError as exc:
            raise AuthError("token signature does not verify") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(f"token lacks the {exc.claim!r} claim") from exc
        except ClaimTypeError as exc:
            raise AuthError(str(exc)) from exc
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {type(exc).__name__}") from exc
        except (TypeError, ValueError) as exc:  # pyjwt's word for a key that does not fit the algorithm
            raise AuthError(f"the signing key cannot verify {alg} tokens") from exc
        _check_text(claims, "claim")
        if (what := _declared_not_access(None, claims)) is not None:
            raise AuthError(f"token is {what}, not an access token")
        iat = claims.get("iat")
        if isinstance(iat, (int, float)) and iat > time.time() + self.cfg.leeway_seconds:
            raise AuthError("token not yet valid (nbf/iat in the future)")
        try:
            scopes = identity.strings(identity.claim(claims, self.cfg.scopes_claim), self.cfg.scopes_claim, split=True)
            principal = identity.principal(claims, self.cfg, scopes)
        except identity.ClaimError as exc:
            raise AuthError(str(exc)) from exc
        missing = [s for s in self.cfg.required_scopes if s not in scopes]
        if missing:
            raise AuthError(
                f"missing scope {' '.join(missing)}",
                error="insufficient_scope",
                status=403,
                scope=self.cfg.required_scopes,
            )
        exp = claims.get("exp")
        return principal, float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None, alg


def mint_hs256(
    secret: str,
    *,
    issuer: str,
    audience: str,
    sub: str,
    roles: list[str],
    groups: list[str] | None = None,
    scopes: list[str] | None = None,
    kind: str = "agent",
    ttl_seconds: int = 3600,
) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "sub": sub,
        "iat": now,
        "nbf": now,
        "exp": now + ttl_seconds,
        "jti": uuid.uuid4().hex,
        "roles": roles,
        "groups": groups or [],
        "scope": " ".join(scopes or []),
        "pvegate_kind": kind,
    }
    return jwt.encode(claims, secret, algorithm="HS256")
