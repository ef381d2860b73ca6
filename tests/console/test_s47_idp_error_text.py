"""The provider's `error` / `error_description` on the sign-in callback is text anyone holding the sign-in
cookie can choose (its `state` is readable there): it went whole into the refusal's audit row and the page.
Now cut, with what a reader would not see as itself escaped (found in review)."""

from __future__ import annotations

import dataclasses
import json
from urllib.parse import urlencode

from starlette.responses import Response

from gateway.admin.console.oidc import Login
from gateway.admin.console.session import LOGIN_COOKIE
from gateway.dev.devenv import DevEnv
from tests.console.conftest import Browsers, sessions_of
from tests.support import GatewayThread, audit_rows


def _login_cookie(env: DevEnv, state: str) -> str:
    """The cookie /admin/login sets for a sign-in attempt (the provider is not reachable here)."""
    out = Response()
    sessions_of(env).write_login(out, dataclasses.asdict(Login(state, "nonce", "verifier", "/admin/", None)))
    return out.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]


def test_s47_a_providers_error_text_is_cut_and_made_visible(
    cgw: GatewayThread, cenv: DevEnv, browsers: Browsers
) -> None:
    b = browsers(cenv, None)
    state = "s47-state"
    b.http.cookies.set(LOGIN_COOKIE, _login_cookie(cenv, state), domain="127.0.0.1", path="/")
    noise = "\x1b[2J\u202e" + "x" * 20_000
    query = urlencode({"state": state, "error": "access_denied" + "e" * 500, "error_description": noise})
    r = b.get(f"/admin/callback?{query}")
    assert r.status_code < 500 and "x" * 1000 not in r.text
    rows = [
        json.loads(str(row["body"]))
        for row in audit_rows(cenv.config.audit_path)
        if row["kind"] == "console" and row["outcome"] == "refused"
    ]
    reason = [x["reason"] for x in rows if "identity provider refused" in x.get("reason", "")][-1]
    assert len(reason) < 600, len(reason)
    assert "\x1b" not in reason and "\u202e" not in reason and "\\u001b" in reason, reason[:120]
