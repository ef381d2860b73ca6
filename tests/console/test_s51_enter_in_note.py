"""Enter in the vote's note field must not approve.

The vote form has one text field (the note) and two submit buttons, Approve first. A browser submits a
form on Enter in a text field by clicking its default button, the first submit button in tree order:
an approver typing "no: wrong guest" and pressing Enter approved the request and minted its one-time
token, the opposite of the vote they meant. The form now opens with a disabled submit button, so
Enter submits nothing (HTML's implicit submission does nothing when the default button is disabled)
and only a click on Approve or Deny votes.

Debian's Chromium driven by Playwright, a session cookie signed with the gateway's key (what a
sign-in leaves; the sign-in itself is test_browser.py's), the real gateway, OPA and simulator.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.admin.console.session import SESSION_COOKIE, Session
from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, outcome
from tests.console.conftest import CAROL, cookie_value
from tests.support import GatewayThread

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = os.environ.get("PVEGATE_CHROMIUM", "/usr/bin/chromium")
_timeouts = itertools.count(3100)


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make tools` (scripts/provision-chromium.sh)")
    async with playwright_api.async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        await b.close()


async def _pending(api: Api) -> str:
    res = await api.call(api.agent(), "vm_shutdown", {"vmid": 100, "timeout": next(_timeouts)})
    assert outcome(res) == "pending_approval", res
    return str(res["structuredContent"]["approval"]["id"])


async def _state(api: Api, aid: str) -> dict[str, Any]:
    r = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)
    doc: dict[str, Any] = r.json()
    return doc


async def _carol_page(chromium: Any, env: DevEnv) -> Any:
    base = env.url.rsplit("/mcp", 1)[0]
    ctx = await chromium.new_context(ignore_https_errors=True)
    session = Session.start(CAROL, CAROL.sub, time.time() - 1)
    await ctx.add_cookies([{"name": SESSION_COOKIE, "value": cookie_value(env, session), "url": base}])
    return await ctx.new_page()


async def test_enter_in_the_note_does_not_vote(cgw: GatewayThread, cenv: DevEnv, api: Api, chromium: Any) -> None:
    aid = await _pending(api)
    page = await _carol_page(chromium, cenv)
    base = cenv.url.rsplit("/mcp", 1)[0]
    try:
        await page.goto(f"{base}/admin/approvals/{aid}")
        assert await page.inner_text("#state") == "pending"
        assert await page.locator("#decide button").count() == 3
        assert [await b.is_visible() for b in await page.locator("#decide button").all()] == [False, True, True]
        await page.fill("#note", "no: wrong guest")
        await page.press("#note", "Enter")
        await asyncio.sleep(1.0)  # a submission would be under way (or done) by now
        await page.wait_for_load_state()
        doc = await _state(api, aid)
        assert doc["state"] == "pending" and not doc["approvals"] and not doc["denials"], doc
        # the buttons still vote, with the note
        await page.click("#deny")
        assert "the request is <b>denied</b>" in await page.inner_html("#result")
        doc = await _state(api, aid)
        assert doc["state"] == "denied" and [d["note"] for d in doc["denials"]] == ["no: wrong guest"], doc
    finally:
        await page.context.close()


async def test_approve_still_approves_by_click(cgw: GatewayThread, cenv: DevEnv, api: Api, chromium: Any) -> None:
    aid = await _pending(api)
    page = await _carol_page(chromium, cenv)
    base = cenv.url.rsplit("/mcp", 1)[0]
    try:
        await page.goto(f"{base}/admin/approvals/{aid}")
        await page.fill("#note", "ok")
        await page.click("#approve")
        assert "the request is <b>approved</b>" in await page.inner_html("#result")
        assert (await _state(api, aid))["state"] == "approved"
    finally:
        await page.context.close()
