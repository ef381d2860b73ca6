"""Console sessions: a signed cookie, an idle timeout, a CSRF token.

The session is a cookie signed (HMAC, itsdangerous) with `console.session_key`, which
every replica is given, so any replica reads any session and none keeps state. The
signature's timestamp is renewed as the session is used: a cookie not renewed within
`idle_timeout_seconds` is refused, and none outlives `max_session_seconds` after its
sign-in. Sign-out clears the cookie and records the session's id in the shared database
(store/handoffs.py), which every replica checks on every console request, so a copy of the
cookie is refused after sign-out too.

The cookie is HttpOnly, Secure, SameSite=Strict and named with the `__Host-` prefix, which a
browser only accepts from this very host, Secure, without Domain and with Path=/: a sibling
subdomain cannot toss in a cookie of its own (its signed session, to sign the person in as
someone else). The sign-in attempt (state, nonce, PKCE verifier) rides in a second signed cookie,
prefixed the same way, that must be SameSite=Lax: the provider's redirect back is a cross-site
navigation.

CSRF: every form carries the session's random token (synchronizer pattern), compared in
constant time; a state change with a foreign Origin is refused as well.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from gateway.core.origins import url_origin
from gateway.core.principal import Principal

SESSION_COOKIE = "__Host-pvegate_console"
LOGIN_COOKIE = "__Host-pvegate_console_login"
COOKIE_PATH = "/"  # what the __Host- prefix requires (the cookie authenticates nothing outside /admin/)
LOGIN_TTL = 600  # a sign-in attempt at the provider must come back within ten minutes
RENEW_AFTER = 30  # renew the cookie (and its idle clock) at most this often


@dataclass
class Session:
    sub: str
    iss: str
    roles: list[str]
    groups: list[str]
    scopes: list[str]
    client_id: str | None
    kind: str
    name: str  # what the person is called on screen (preferred_username, else sub)
    auth_time: float  # when the provider last authenticated this person (step-up compares with it)
    started: float
    # the database's clock at the sign-in (shared sign-outs are stamped on it, and a replica's own clock may
    # run ahead of it: a session begun before a sign-out everywhere would seem begun after it); None in a
    # cookie written before it was kept
    db_started: float | None = None
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    sid: str = field(default_factory=lambda: secrets.token_urlsafe(16))

    @property
    def began(self) -> float:
        """When the session began on the database's clock, as sign-outs are compared."""
        return self.started if self.db_started is None else self.db_started

    @property
    def principal(self) -> Principal:
        return Principal(
            sub=self.sub,
            iss=self.iss,
            roles=tuple(self.roles),
            groups=tuple(self.groups),
            scopes=tuple(self.scopes),
            client_id=self.client_id,
            kind=self.kind,
        )

    @classmethod
    def start(cls, principal: Principal, name: str, auth_time: float) -> Session:
        return cls(
            sub=principal.sub,
            iss=principal.iss,
            roles=list(principal.roles),
            groups=list(principal.groups),
            scopes=list(principal.scopes),
            client_id=principal.client_id,
            kind=principal.kind,
            name=name,
            auth_time=auth_time,
            started=time.time(),
        )


class Sessions:
    """Signs, reads and renews the session and sign-in cookies."""

    def __init__(self, key: str, idle_timeout: int, max_session: int, secure: bool = True) -> None:
        if len(key) < 32:
            raise ValueError("console.session_key must be at least 32 characters")
        self.idle_timeout = idle_timeout
        self.max_session = max_session
        self.secure = secure
        self._session = URLSafeTimedSerializer(key, salt="pvegate-console-session")
        self._login = URLSafeTimedSerializer(key, salt="pvegate-console-login")

    # --- the session --------------------------------------------------------------------

    def read(self, request: Request) -> tuple[Session | None, bool]:
        """(the session, whether its cookie should be renewed); None when absent, forged or timed out."""
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None, False
        try:
            doc, signed_at = self._session.loads(raw, max_age=self.idle_timeout, return_timestamp=True)
            session = Session(**doc)
        except (BadSignature, SignatureExpired, TypeError, ValueError):
            return None, False
        now = time.time()
        if now - session.started > self.max_session:
            return None, False
        return session, now - signed_at.timestamp() >= RENEW_AFTER

    def write(self, response: Response, session: Session) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            self._session.dumps(asdict(session)),
            max_age=self.idle_timeout,
            path=COOKIE_PATH,
            secure=self.secure,
            httponly=True,
            samesite="strict",
        )

    def clear(self, response: Response) -> None:
        response.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, secure=self.secure, httponly=True, samesite="strict")

    # --- the sign-in attempt ------------------------------------------------------------

    def write_login(self, response: Response, doc: dict[str, Any]) -> None:
        response.set_cookie(
            LOGIN_COOKIE,
            self._login.dumps(doc),
            max_age=LOGIN_TTL,
            path=COOKIE_PATH,
            secure=self.secure,
            httponly=True,
            samesite="lax",  # the provider's redirect back is cross-site: Strict would not be sent
        )

    def read_login(self, request: Request) -> dict[str, Any] | None:
        raw = request.cookies.get(LOGIN_COOKIE)
        if not raw:
            return None
        try:
            doc = self._login.loads(raw, max_age=LOGIN_TTL)
        except (BadSignature, SignatureExpired):
            return None
        return doc if isinstance(doc, dict) else None

    def clear_login(self, response: Response) -> None:
        response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH, secure=self.secure, httponly=True, samesite="lax")


def csrf_ok(session: Session, presented: Any) -> bool:
    if not isinstance(presented, str):
        return False
    try:
        given = presented.encode()
    except UnicodeEncodeError:  # a lone surrogate (a form in UTF-7 can carry one): no token of ours
        return False
    return hmac.compare_digest(session.csrf.encode(), given)


def same_origin(request: Request, public_url: str | None = None) -> bool:
    """A browser names the page's origin on a POST; one from another site is refused (absent is allowed:
    the CSRF token still has to match). The console's site is `public_url` when configured: the Host a
    request arrives with is the client's to choose (and behind a proxy the backend's)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    if public_url:
        if any(c in origin.split("://", 1)[-1] for c in "/?#@\\"):  # an Origin is scheme://host[:port], no more
            return False
        mine = url_origin(public_url)
        return mine is not None and url_origin(origin) == mine
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host
