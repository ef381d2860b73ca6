"""Sign out with a session that already ended (idle timeout, its absolute lifetime, signed out in another
browser, or a cookie that no longer verifies). The sign-out answered with a redirect to /admin/login, which
starts a sign-in at once: with the provider's own session still alive (single sign-on), the provider sends
the browser straight back and the person is signed in again, a fresh session, by pressing "Sign out". On a
shared machine they walk away signed in. The sign-out now ends where it says: the cookie cleared, "You are
signed out", and no sign-in started.

Real gateway, OPA and simulator (the provider is never reached: nothing may start a sign-in)."""

from __future__ import annotations

import time

from gateway.admin.console.session import LOGIN_COOKIE, SESSION_COOKIE, Session
from gateway.dev.devenv import DevEnv
from tests.console.conftest import CAROL, Browser, Browsers, cookie_value
from tests.support import GatewayThread


def _signed_out_page(b: Browser) -> None:
    r = b.post("/admin/logout", {"csrf": b.csrf if b.session else ""})
    assert r.status_code == 200, (r.status_code, r.headers.get("location"))
    assert "You are signed out" in r.text
    assert "/admin/login" not in r.headers.get("location", "")
    cookies = r.headers.get_list("set-cookie")
    assert any(c.startswith(f'{SESSION_COOKIE}=""') and "Max-Age=0" in c for c in cookies), cookies
    assert not any(c.startswith(f"{LOGIN_COOKIE}=") and "Max-Age=0" not in c for c in cookies), cookies


def test_s47_signing_out_an_ended_session_starts_no_sign_in(
    cgw: GatewayThread, cenv: DevEnv, browsers: Browsers
) -> None:
    # past its absolute lifetime
    b = browsers(cenv, CAROL)
    assert b.session is not None
    old = Session.start(CAROL, "carol", time.time())
    old.started = time.time() - cenv.config.console.max_session_seconds - 1
    b.session = old
    b.http.cookies.set(SESSION_COOKIE, cookie_value(cenv, old), domain="127.0.0.1", path="/")
    _signed_out_page(b)
    # signed out already (a copy of the cookie, in another browser, signed out first)
    first = browsers(cenv, CAROL)
    assert first.session is not None
    copy = browsers(cenv, None)
    copy.session = first.session
    copy.http.cookies.set(SESSION_COOKIE, cookie_value(cenv, first.session), domain="127.0.0.1", path="/")
    assert first.post("/admin/logout", {"csrf": first.csrf}).status_code == 200
    _signed_out_page(copy)
    # a cookie that does not verify, and none at all
    forged = browsers(cenv, CAROL)
    good = forged.http.cookies.get(SESSION_COOKIE)
    assert good is not None
    forged.http.cookies.set(SESSION_COOKIE, good[:-3] + "AAA", domain="127.0.0.1", path="/")
    _signed_out_page(forged)
    _signed_out_page(browsers(cenv, None))


def test_s47_another_sites_sign_out_form_clears_nothing(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    """Defence in depth (the transport guard refuses a foreign Origin first): no token, no cookie cleared."""
    b = browsers(cenv, CAROL)
    for who in (b, browsers(cenv, None)):
        r = who.post("/admin/logout", {"csrf": ""}, headers={"origin": "https://evil.example"})
        assert r.status_code == 403 and "set-cookie" not in r.headers
    assert b.get("/admin/approvals").status_code == 200  # still signed in
