"""Sign out everywhere ends a session begun on a replica whose clock runs ahead of the database's.

A person's sign-out everywhere is stamped on the database's clock (every session of theirs that began
before it is over); a session's start was stamped on the clock of the replica that signed it in. On a
replica running two minutes ahead, a session begun a minute before the sign-out looked begun after it
and stayed valid: the stolen cookie the sign-out was for went on working. The session now keeps its start
on the database's clock too, and sign-outs compare with that. Real Keycloak, real Chromium, the gateway
in this process with its session clock set two minutes ahead (the database's clock is the real one)."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from typing import Any

import httpx
import pytest

from gateway.admin.console import session as session_module
from gateway.admin.console.session import SESSION_COOKIE
from gateway.cli import main as cli
from gateway.dev.devenv import DevEnv
from tests.console.test_browser import base, benv, bgw, browser, bsim, new_page, sign_in_at
from tests.support import GatewayThread, audit_rows

__all__ = ["benv", "bgw", "browser", "bsim"]  # fixtures, used by name

AHEAD = 120.0


class _AheadClock:
    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def time(self) -> float:
        return time.time() + AHEAD


async def test_sign_out_everywhere_ends_a_session_a_fast_replica_began(
    bgw: GatewayThread, benv: DevEnv, keycloak: Any, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "time", _AheadClock())
    page = await new_page(browser)
    await sign_in_at(page, base(benv) + "/admin/approvals", keycloak, "bob")
    bodies = [(row["principal"], json.loads(row["body"])) for row in audit_rows(benv.config.audit_path)]
    subs = {sub for sub, body in bodies if body.get("action") == "sign_in" and body.get("name") == "bob"}
    assert len(subs) == 1, subs
    cookie = {c["name"]: c["value"] for c in await page.context.cookies() if c["name"] == SESSION_COOKIE}
    tls = ssl.create_default_context(cafile=str(benv.ca_file))
    try:
        async with httpx.AsyncClient(verify=tls, cookies=cookie, headers={"accept": "text/html"}) as http:
            assert (await http.get(base(benv) + "/admin/approvals")).status_code == 200
            argv = ["console", "sign-out", "--sub", subs.pop(), "--config", str(benv.config_path)]
            assert await asyncio.to_thread(cli, argv) == 0
            r = await http.get(base(benv) + "/admin/approvals")
        assert r.status_code == 303 and r.headers["location"].startswith("/admin/login"), (r, r.text[:300])
    finally:
        await page.context.close()
