"""Console session cookies: signature, idle timeout, renewal, absolute lifetime, attributes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from itsdangerous import timed
from starlette.requests import Request
from starlette.responses import Response

from gateway.admin.console.session import (
    LOGIN_COOKIE,
    RENEW_AFTER,
    SESSION_COOKIE,
    Session,
    Sessions,
    csrf_ok,
    same_origin,
)
from gateway.core.principal import Principal

KEY = "k" * 40
ALICE = Principal("alice", "idp", ("approver",), ("sre-leads",), (), "pvegate-console", "human")


def request(cookies: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if cookies:
        raw.append((b"cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()).encode()))
    return Request({"type": "http", "method": "POST", "path": "/admin/x", "headers": raw})


def issued(sessions: Sessions, session: Session, at: float | None = None, monkeypatch: Any = None) -> str:
    if at is not None:
        monkeypatch.setattr(timed.time, "time", lambda: at)
    out = Response()
    sessions.write(out, session)
    if at is not None:
        monkeypatch.undo()
    return out.headers["set-cookie"]


def value(set_cookie: str) -> str:
    return set_cookie.split(";", 1)[0].split("=", 1)[1]


def test_cookie_attributes() -> None:
    sessions = Sessions(KEY, 600, 3600)
    header = issued(sessions, Session.start(ALICE, "alice", time.time()))
    for attr in ("HttpOnly", "Secure", "SameSite=strict", "Path=/", "Max-Age=600"):
        assert attr.lower() in header.lower(), attr
    out = Response()
    sessions.write_login(out, {"state": "s"})
    login = out.headers["set-cookie"]
    assert login.startswith(LOGIN_COOKIE) and "samesite=lax" in login.lower() and "httponly" in login.lower()
    # __Host-: a browser takes it only Secure, from this host (no Domain), for Path=/ (no cookie tossing
    # from a sibling subdomain); the names say so, and the attributes are what the prefix demands
    for cookie in (header, login, *_cleared(sessions)):
        name, attrs = cookie.split("=", 1)[0], [a.strip().lower() for a in cookie.split(";")[1:]]
        assert name.startswith("__Host-"), cookie
        assert "secure" in attrs and "path=/" in attrs and not any(a.startswith("domain") for a in attrs), cookie


def _cleared(sessions: Sessions) -> list[str]:
    out = Response()
    sessions.clear(out)
    sessions.clear_login(out)
    return [v.decode() for k, v in out.raw_headers if k == b"set-cookie"]


def test_a_session_reads_back_and_renews_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = Sessions(KEY, 600, 3600)
    s = Session.start(ALICE, "alice", time.time() - 5)
    fresh = value(issued(sessions, s))
    got, renew = sessions.read(request({SESSION_COOKIE: fresh}))
    assert got is not None and got.principal == ALICE and got.csrf == s.csrf and not renew
    older = value(issued(sessions, s, at=time.time() - RENEW_AFTER - 1, monkeypatch=monkeypatch))
    got, renew = sessions.read(request({SESSION_COOKIE: older}))
    assert got is not None and renew


def test_idle_forged_and_over_age_sessions_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = Sessions(KEY, 600, 3600)
    s = Session.start(ALICE, "alice", time.time())
    idle = value(issued(sessions, s, at=time.time() - 601, monkeypatch=monkeypatch))
    assert sessions.read(request({SESSION_COOKIE: idle})) == (None, False)
    other_key = value(issued(Sessions("x" * 40, 600, 3600), s))
    assert sessions.read(request({SESSION_COOKIE: other_key})) == (None, False)
    s.started = time.time() - 3601
    assert sessions.read(request({SESSION_COOKIE: value(issued(sessions, s))})) == (None, False)
    with pytest.raises(ValueError, match="at least 32 characters"):
        Sessions("short", 600, 3600)


def test_csrf_and_origin() -> None:
    s = Session.start(ALICE, "alice", time.time())
    assert csrf_ok(s, s.csrf) and not csrf_ok(s, "x") and not csrf_ok(s, None)
    assert same_origin(request(headers={"host": "gw:8443", "origin": "https://gw:8443"}))
    assert same_origin(request(headers={"host": "gw:8443"}))  # no Origin: the token still decides
    assert not same_origin(request(headers={"host": "gw:8443", "origin": "https://evil.example"}))
    assert not same_origin(request(headers={"host": "gw:8443", "origin": "null"}))


def test_origin_is_compared_with_the_public_url_when_one_is_configured() -> None:
    public = "https://gw.example.org:8443/"
    # behind a proxy the Host is the backend's: the page's origin is still the public one
    behind = {"host": "10.0.0.5:8000", "origin": "https://gw.example.org:8443"}
    assert same_origin(request(headers=behind), public)
    assert same_origin(request(headers={**behind, "origin": "https://GW.example.org:8443"}), public)
    assert same_origin(request(headers={"host": "gw.example.org"}), public)  # no Origin: the token decides
    # an Origin that matches the Host a client sent, but is not the configured site, is foreign
    for origin, host in (
        ("https://evil.example", "evil.example"),
        ("http://gw.example.org:8443", "gw.example.org:8443"),  # another scheme is another origin
        ("https://gw.example.org", "gw.example.org"),  # and another port
        ("https://gw.example.org:8443/path", "gw.example.org:8443"),  # no origin at all
        ("null", "gw.example.org:8443"),
    ):
        assert not same_origin(request(headers={"host": host, "origin": origin}), public), origin
    # the default port is the same origin written either way
    assert same_origin(request(headers={"host": "x", "origin": "https://gw.example.org"}), "https://gw.example.org:443")
    assert same_origin(request(headers={"host": "x", "origin": "https://gw.example.org:443"}), "https://gw.example.org")
