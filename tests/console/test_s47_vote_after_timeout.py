"""A vote sent after the session ended (idle timeout while the approver read the request) is sent to sign in,
and sign-in returns to where `next` says. That was the form's own URL, `/admin/approvals/ID/vote`, which
only takes a POST: after signing in the approver landed on a bare 405 "Method Not Allowed", the request
out of sight. A form's sign-in now returns to the page the form is on (the vote's to the request); the vote
itself is never replayed (it is cast again, on the page, with the fresh session).

Real gateway, OPA and simulator."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api
from tests.console.conftest import CAROL, Browsers
from tests.console.test_pages import pending
from tests.support import GatewayThread


def _next_of(location: str) -> str:
    parts = urlsplit(location)
    assert parts.path == "/admin/login", location
    return parse_qs(parts.query)["next"][0]


def test_s47_a_vote_without_a_session_returns_to_the_request_after_sign_in(
    api: Api, cgw: GatewayThread, cenv: DevEnv, browsers: Browsers
) -> None:
    aid, _, _ = pending(api)
    anonymous = browsers(cenv, None)
    carol = browsers(cenv, CAROL)
    r = anonymous.post(f"/admin/approvals/{aid}/vote", {"csrf": "x", "verdict": "approve"})
    assert r.status_code == 303
    nxt = _next_of(r.headers["location"])
    assert nxt == f"/admin/approvals/{aid}", nxt
    back = carol.get(nxt)  # where the continue page takes the signed-in approver
    assert back.status_code == 200 and 'id="decide"' in back.text, back.status_code
    # the what-if form's page takes a GET as it is
    r = anonymous.post("/admin/whatif", {"csrf": "x", "tool": "vm_shutdown"})
    assert r.status_code == 303 and _next_of(r.headers["location"]) == "/admin/whatif"
    # a page's GET keeps its query
    r = anonymous.get("/admin/approvals?state=pending")
    assert _next_of(r.headers["location"]) == "/admin/approvals?state=pending"
