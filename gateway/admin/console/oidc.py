"""OpenID Connect sign-in for the console: authorization code with PKCE, verified ID tokens.

Only an issuer and a client id come from configuration; the endpoints come from the
provider's discovery document, the signing keys from its JWKS (gateway/auth/jwks.py:
cached, and refreshed on an unknown `kid`, so key rotation at the provider is followed).
The ID token is checked for signature, issuer (exactly the one the discovery document names,
which must be the configured one), audience (our client id), `azp`, expiry,
the nonce this browser was given, and `auth_time` (present, and recent enough when the
sign-in asked for `max_age`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import jwt

from gateway.auth.jwks import ALG_KEY_TYPES, JwksKeys, KeyUnavailable
from gateway.auth.tokens import STRICT_JWT, ClaimTypeError
from gateway.core.config import ConsoleConfig

DISCOVERY_TTL = 3600.0
LEEWAY = 30


class SignInError(Exception):
    """Sign-in cannot complete; the message is safe to show to the person signing in."""


def _loopback_or_https(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"))


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, S256 code_challenge), RFC 7636."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def _finite(value: int | float) -> bool:
    """A number a float holds (an int of 400 digits does not: math.isfinite would raise OverflowError)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Login:
    """What one browser's sign-in attempt must find again at the callback."""

    state: str
    nonce: str
    verifier: str
    return_to: str
    max_age: int | None


@dataclass(frozen=True)
class Identity:
    """The verified result of a sign-in."""

    id_claims: dict[str, Any]
    access_token: str | None
    auth_time: float


class Provider:
    """The configured OpenID provider: discovery, the authorization URL, the code exchange."""

    def __init__(self, cfg: ConsoleConfig, timeout: float = 10.0) -> None:
        self.cfg = cfg
        self.timeout = timeout
        self._secret = cfg.client_secret.read() if cfg.client_secret is not None else None
        self._meta: dict[str, Any] | None = None
        self._meta_at = 0.0
        self._jwks: JwksKeys | None = None
        self._lock = asyncio.Lock()
        self._issuer_base = cfg.issuer.rstrip("/")

    async def metadata(self) -> dict[str, Any]:
        async with self._lock:
            if self._meta is not None and time.monotonic() - self._meta_at < DISCOVERY_TTL:
                return self._meta
            # OpenID Connect Discovery 1.0, section 4: a trailing slash is removed before the path is appended
            url = f"{self._issuer_base}/.well-known/openid-configuration"
            try:
                async with httpx.AsyncClient(timeout=self.timeout) as http:
                    r = await http.get(url, headers={"accept": "application/json"})
                    r.raise_for_status()
                    meta = r.json()
            except (httpx.HTTPError, ValueError) as exc:
                if self._meta is not None:  # keep serving what we know while the provider is away
                    return self._meta
                raise SignInError(f"the identity provider's discovery document is unavailable ({exc})") from exc
            # the issuer named must be the configured one (section 4.3); the configuration may hold it without
            # its trailing slash (Auth0's issuer ends in one), so that one slash is the only leeway
            if not isinstance(meta, dict) or meta.get("issuer") not in (self._issuer_base, self._issuer_base + "/"):
                raise SignInError("the identity provider's discovery document names another issuer")
            for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(meta.get(key), str) or not _loopback_or_https(meta[key]):
                    raise SignInError(f"the identity provider's {key} is missing or not https")
            if self._jwks is None or self._jwks.url != meta["jwks_uri"]:
                self._jwks = JwksKeys(url=meta["jwks_uri"])
            self._meta, self._meta_at = meta, time.monotonic()
            return meta

    async def authorize_url(self, login: Login, redirect_uri: str, challenge: str) -> str:
        meta = await self.metadata()
        params = {
            "response_type": "code",
            "client_id": self.cfg.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(self.cfg.scopes),
            "state": login.state,
            "nonce": login.nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        if login.max_age is not None:  # step-up: the provider asks again when the last login is older
            params["max_age"] = str(login.max_age)
        endpoint = str(meta["authorization_endpoint"])
        return endpoint + ("&" if "?" in endpoint else "?") + urlencode(params)

    async def end_session_url(self) -> str | None:
        try:
            meta = await self.metadata()
        except SignInError:
            return None
        url = meta.get("end_session_endpoint")
        return url if isinstance(url, str) and _loopback_or_https(url) else None

    async def exchange(self, code: str, login: Login, redirect_uri: str) -> Identity:
        """The code for tokens at the token endpoint, and the ID token verified."""
        meta = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": login.verifier,
            "client_id": self.cfg.client_id,
        }
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as http:
                if self._secret:  # a confidential client: HTTP Basic (client_secret_basic)
                    auth = httpx.BasicAuth(self.cfg.client_id, self._secret)
                    r = await http.post(str(meta["token_endpoint"]), data=form, auth=auth)
                else:
                    r = await http.post(str(meta["token_endpoint"]), data=form)
        except httpx.HTTPError as exc:
            raise SignInError(f"the identity provider's token endpoint is unreachable ({type(exc).__name__})") from exc
        try:
            doc = r.json()
        except ValueError:
            doc = {}
        if r.status_code != 200 or not isinstance(doc, dict):
            error = doc.get("error") if isinstance(doc, dict) else None
            raise SignInError(f"the identity provider refused the sign-in code ({error or f'HTTP {r.status_code}'})")
        id_token = doc.get("id_token")
        if not isinstance(id_token, str):
            raise SignInError("the identity provider sent no ID token (is 'openid' among console.scopes?)")
        claims = await self.verify_id_token(id_token, login)
        access = doc.get("access_token")
        return Identity(claims, access if isinstance(access, str) else None, float(claims["auth_time"]))

    async def verify_id_token(self, token: str, login: Login, now: float | None = None) -> dict[str, Any]:
        meta = await self.metadata()
        assert self._jwks is not None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise SignInError("the ID token is malformed") from exc
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALG_KEY_TYPES:  # asymmetric only: never alg none or HS
            raise SignInError(f"the ID token's algorithm {alg!r} is not accepted")
        kid = header.get("kid")
        try:
            key = await self._jwks.key_for(kid if isinstance(kid, str) else None, alg)
        except KeyUnavailable as exc:
            raise SignInError(f"the ID token's signing key is unknown ({exc})") from exc
        try:
            # held to JSON as access tokens are: a claim named twice (a second sub or nonce) is refused, not
            # read as its last copy, and NaN or Infinity in any claim is no number
            claims: dict[str, Any] = STRICT_JWT.decode(
                token,
                key=key,
                algorithms=[alg],
                audience=self.cfg.client_id,
                issuer=str(meta["issuer"]),  # exactly as the provider names it (checked against ours above)
                leeway=LEEWAY,
                options={"require": ["exp", "iat", "sub", "iss", "aud"]},  # auth_time and nonce: below
            )
        except jwt.MissingRequiredClaimError as exc:
            raise SignInError(f"the ID token lacks the {exc.claim!r} claim") from exc
        except ClaimTypeError as exc:
            raise SignInError(f"the ID token is refused: {exc}") from exc
        except jwt.PyJWTError as exc:
            raise SignInError(f"the ID token does not verify ({type(exc).__name__})") from exc
        nonce = claims.get("nonce")  # absent, or another attempt's: not this browser's sign-in
        if not isinstance(nonce, str) or not secrets.compare_digest(nonce.encode(), login.nonce.encode()):
            raise SignInError("the ID token was not issued for this sign-in (nonce)")
        aud = claims["aud"]
        azp = claims.get("azp")
        if ((isinstance(aud, list) and len(aud) > 1) or azp is not None) and azp != self.cfg.client_id:
            raise SignInError("the ID token was issued to another client (azp)")
        auth_time = claims.get("auth_time")
        if not isinstance(auth_time, int | float) or isinstance(auth_time, bool) or not _finite(auth_time):
            raise SignInError("the ID token has no auth_time (when you authenticated): step-up cannot be checked")
        now = time.time() if now is None else now
        # a sign-in later than now would pass every step-up limit for the session's whole life: refused
        if float(auth_time) > now + LEEWAY:
            raise SignInError("the ID token's auth_time is in the future (is the provider's clock right?)")
        if login.max_age is not None and now - float(auth_time) > login.max_age + LEEWAY:
            raise SignInError("the identity provider did not ask you to sign in again (auth_time too old)")
        return claims
