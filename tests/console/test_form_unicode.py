"""A console form field that is not valid Unicode text is refused with a 400 naming it, never a 500.

A multipart/form-data body may name its charset, and `+2AA-` in UTF-7 decodes to a lone surrogate (U+D800):
no text the gateway can compare, store or audit. The CSRF check used to fail encoding it (a 500 with a
traceback) and a vote's note reached the database with it. Real gateway, real OPA, real simulator."""

from __future__ import annotations

import asyncio
import html
import secrets

import httpx

from gateway.admin.api import note_problem
from gateway.admin.console.session import Session, csrf_ok
from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api
from tests.console.conftest import CAROL, Browser, Browsers
from tests.console.test_pages import ERIN, pending
from tests.support import GatewayThread

SURROGATE_UTF7 = "+2AA-"  # U+D800 in UTF-7


def multipart(fields: dict[str, str]) -> tuple[bytes, str]:
    """A multipart/form-data body that says its values are UTF-7."""
    boundary = secrets.token_hex(12)
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    body = ("".join(parts) + f"--{boundary}--\r\n").encode("ascii")
    return body, f"multipart/form-data; boundary={boundary}; charset=utf-7"


def post_multipart(b: Browser, path: str, fields: dict[str, str]) -> httpx.Response:
    body, ctype = multipart(fields)
    return b.http.post(b.base + path, content=body, headers={"content-type": ctype})


def refused_as_not_unicode(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    text = html.unescape(r.text)
    assert f"{field} is not valid Unicode text" in text, text[:800]
    assert "Traceback" not in text and "UnicodeEncodeError" not in text


def test_csrf_ok_refuses_a_token_that_is_no_text() -> None:
    s = Session.start(CAROL, "carol", 0.0)
    assert not csrf_ok(s, "\ud800")
    assert not csrf_ok(s, s.csrf[:-1] + "\udcff")


def test_note_problem_refuses_a_lone_surrogate() -> None:
    assert note_problem("fine\ud800") == "note must be valid Unicode text"


def test_a_vote_with_a_surrogate_is_refused(api: Api, carol: Browser) -> None:
    aid, _, _ = pending(api)
    path = f"/admin/approvals/{aid}/vote"
    r = post_multipart(carol, path, {"csrf": SURROGATE_UTF7, "verdict": "approve"})
    refused_as_not_unicode(r, "csrf")
    r = post_multipart(carol, path, {"csrf": carol.csrf, "verdict": "deny", "note": SURROGATE_UTF7})
    refused_as_not_unicode(r, "note")
    state = asyncio.run(api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)).json()["state"]
    assert state == "pending"  # nothing recorded
    # an ordinary UTF-7 form is text like any other
    r = post_multipart(carol, path, {"csrf": carol.csrf, "verdict": "deny", "note": "plain"})
    assert r.status_code == 200 and "<b>denied</b>" in r.text, r.text[:300]


def test_what_if_and_sign_out_with_a_surrogate_are_refused(
    cgw: GatewayThread, cenv: DevEnv, browsers: Browsers
) -> None:
    erin = browsers(cenv, ERIN)  # the what-if is the policy section's
    form = {"csrf": erin.csrf, "tool": "vm_shutdown", "kind": "agent", "sub": SURROGATE_UTF7, "arguments": "{}"}
    refused_as_not_unicode(post_multipart(erin, "/admin/whatif", form), "sub")
    r = post_multipart(erin, "/admin/logout", {"csrf": SURROGATE_UTF7})
    refused_as_not_unicode(r, "csrf")
    assert erin.get("/admin/status").status_code == 200  # still signed in: nothing was done
