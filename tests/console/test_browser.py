"""The console in a real browser: Debian's Chromium driven by Playwright, signing in through
Keycloak's own login page (tests/kcserver.py), against the real gateway, OPA and simulator.

One browser for the module. The agent is Keycloak's client-credentials client; the people are
the realm's alice (approver, group /sre-leads) and bob (viewer). The screenshots go to a temp
dir, or to $PVEGATE_CONSOLE_SCREENSHOTS: `make console-screenshots` regenerates docs/console/.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_types import ElicitRequestURLParams, ElicitResult

from gateway.admin.console.session import SESSION_COOKIE
from gateway.cli import main as cli
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from tests.console.conftest import console_env, console_policy
from tests.support import GatewayThread, audit_rows

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = os.environ.get("PVEGATE_CHROMIUM", "/usr/bin/chromium")
STEP_UP = 20  # seconds: every vote here needs a sign-in this recent
PHONE = {"width": 390, "height": 844}
_timeouts = itertools.count(900)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = os.environ.get("PVEGATE_CONSOLE_SCREENSHOTS")
    path = Path(out) if out else tmp_path_factory.mktemp("console-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def bsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("bsim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def benv(bsim: Any, keycloak: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    policy = console_policy(tmp_path_factory.mktemp("bpolicy"), step_up=STEP_UP, approver_sections="all")
    # the realm's tokens, mapped by the defaults: no custom claim
    return console_env(tmp_path_factory, bsim, "b", policy, keycloak.issuer, keycloak.auth_config())


@pytest.fixture(scope="module")
def bgw(benv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(benv.config).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make tools` (scripts/provision-chromium.sh)")
    async with playwright_api.async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        await b.close()


def base(env: DevEnv) -> str:
    return env.url.rsplit("/mcp", 1)[0]


async def new_page(browser: Any, phone: bool = False) -> Any:
    # the gateway's certificate is from the test CA; Keycloak is plain http on loopback
    ctx = await browser.new_context(
        ignore_https_errors=True,
        viewport=PHONE if phone else {"width": 1280, "height": 900},
        is_mobile=phone,
        device_scale_factor=1,
    )
    return await ctx.new_page()


async def keycloak_login(page: Any, username: str, password: str) -> None:
    """Keycloak's own login form: username (unless it already knows who), password, submit."""
    await page.wait_for_selector("#password")
    username_field = page.locator("#username")
    if await username_field.count() and await username_field.is_editable():
        await username_field.fill(username)
    await page.fill("#password", password)
    await page.click("#kc-login")


async def sign_in_at(page: Any, url: str, kc: Any, username: str) -> None:
    """Open a console URL, sign in at Keycloak, land back on that URL."""
    await page.goto(url)
    assert "/realms/" in page.url, page.url  # sent to the provider's login page
    await keycloak_login(page, username, kc.users[username].password)
    await page.wait_for_url(url, timeout=20_000)  # the continue page moves on by itself


async def shot(page: Any, shots: Path, name: str, full_page: bool = True) -> None:
    await page.screenshot(path=str(shots / f"{name}.png"), full_page=full_page)


def shutdowns(sim: Any, timeout: int) -> int:
    return sum(
        1
        for r in sim.requests_log()
        if r["method"] == "POST"
        and r["path"].endswith("/status/shutdown")
        and str((r.get("body") or {}).get("timeout")) == str(timeout)
    )


async def agent_pending(env: DevEnv, kc: Any) -> str:
    """An agent call that needs an approval, without URL elicitation: the plain pending result."""
    args = {"vmid": 100, "timeout": next(_timeouts)}
    async with mcp_client(env.url, kc.client_credentials_token(), env.ca_file, mode="legacy") as client:
        res = await client.call_tool("vm_shutdown", args)
    assert res.meta and res.meta["pvegate/outcome"] == "pending_approval", res
    return str(res.structured_content["approval"]["approve_url"])


async def test_approver_signs_in_approves_with_step_up_and_the_agent_retry_runs(
    bgw: GatewayThread, benv: DevEnv, bsim: Any, keycloak: Any, browser: Any, shots: Path
) -> None:
    args = {"vmid": 100, "timeout": next(_timeouts)}
    page = await new_page(browser)
    seen: list[str] = []

    async def human_at_the_url(context: Any, params: Any) -> ElicitResult:
        """The elicitation URL opens the console's page; alice signs in and approves there."""
        assert isinstance(params, ElicitRequestURLParams)
        assert params.url.startswith(base(benv) + "/admin/approvals/apr-")
        assert shutdowns(bsim, args["timeout"]) == 0  # nothing ran before the human said yes
        seen.append(params.url)
        await sign_in_at(page, params.url, keycloak, "alice")
        signed_in_at = time.time()  # Keycloak's auth_time is a little earlier
        assert await page.inner_text("#state") == "pending"
        assert '"vmid": 100' in await page.inner_text("#arguments")
        assert "shutting down a prod guest needs an SRE lead" in await page.inner_text("#reason")
        assert "/status/shutdown" in await page.inner_text("#preview")  # the dry run: what would be sent
        assert await page.locator("#may-not").count() == 0  # the policy lets alice vote
        await shot(page, shots, "approval")

        # a form sent without its CSRF token is refused, and nothing changes
        await page.evaluate("document.querySelector('#decide input[name=csrf]').remove()")
        await page.click("#approve")
        assert "CSRF" in await page.inner_text("#message")
        await page.goto(params.url)
        assert await page.inner_text("#state") == "pending"

        # the rest of the console while the sign-in ages past the step-up limit
        for path, name in (("/admin/approvals", "queue"), ("/admin/status", "status")):
            await page.goto(base(benv) + path)
            await shot(page, shots, name)
        await page.goto(base(benv) + "/admin/tools?kind=agent&roles=viewer")
        assert "sees" in await page.inner_text("#visible-count")
        await shot(page, shots, "tools", full_page=False)  # the catalog is long: its first screen
        await page.goto(base(benv) + "/admin/whatif")
        await page.fill("#w-roles", "viewer")
        await page.select_option("#w-tool", "vm_shutdown")
        await page.fill("#w-arguments", '{"vmid": 100}')
        await page.click("#whatif button[type=submit]")
        assert "deny" in await page.inner_text("#decision")
        await shot(page, shots, "whatif")
        await asyncio.sleep(max(0.0, signed_in_at + STEP_UP + 2 - time.time()))

        # step-up: the vote is refused until alice signs in again at Keycloak (max_age)
        await page.goto(params.url)
        await page.click("#approve")
        assert "needs a sign-in within the last" in await page.inner_text("#result")
        await shot(page, shots, "step-up")
        await page.click("#step-up")
        assert "/realms/" in page.url and "max_age=" in page.url
        await keycloak_login(page, "alice", keycloak.users["alice"].password)
        await page.wait_for_url(params.url, timeout=20_000)
        await page.fill("#note", "approved from the browser test")
        await page.click("#approve")
        assert "the request is approved" in await page.inner_text("#result")
        await shot(page, shots, "approved")
        return ElicitResult(action="accept")

    agent = keycloak.client_credentials_token()
    async with mcp_client(
        benv.url, agent, benv.ca_file, mode="2026-07-28", elicitation_callback=human_at_the_url
    ) as client:
        res = await client.call_tool("vm_shutdown", args)
    assert len(seen) == 1
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res  # the retry ran
    assert shutdowns(bsim, args["timeout"]) == 1

    # both in the audit: the call held for approval and the retry that ran, and the vote
    await page.goto(base(benv) + "/admin/audit?tool=vm_shutdown&kind=decision")
    records = await page.inner_text("#records")
    assert "pending" in records and "allow" in records
    assert "verified" in await page.inner_text("#chain")
    await shot(page, shots, "audit")
    await page.goto(base(benv) + "/admin/audit?kind=approval&outcome=approved")
    await page.click("#records tbody tr a")  # the vote, with alice's identity from Keycloak
    vote = await page.inner_text("#body")
    assert '"via": "console"' in vote and '"verdict": "approve"' in vote
    await page.goto(base(benv) + "/admin/audit?kind=console&outcome=csrf_refused")
    assert "csrf_refused" in await page.inner_text("#records")  # the refused form is on record too
    await page.goto(base(benv) + "/admin/approvals?state=used")
    assert "used" in await page.inner_text("#queue")

    await page.click("text=Sign out")
    assert "signed out" in await page.inner_text("#message")
    assert not [c for c in await page.context.cookies() if c["name"] == SESSION_COOKIE]
    await page.context.close()


async def test_a_viewer_cannot_approve_and_sees_why(
    bgw: GatewayThread, benv: DevEnv, keycloak: Any, browser: Any, shots: Path
) -> None:
    url = await agent_pending(benv, keycloak)
    page = await new_page(browser)
    await sign_in_at(page, url, keycloak, "bob")
    why = await page.inner_text("#may-not")
    assert "is not in any of the approver groups" in why
    await shot(page, shots, "viewer")
    await page.click("#approve")
    assert "Your vote was refused" in await page.inner_text("#result")
    assert await page.inner_text("#state") == "pending"
    await page.goto(base(benv) + "/admin/audit")  # bob's roles do not open the audit
    assert "does not open" in await page.inner_text("#message")

    # the operator signs bob out everywhere by his subject, which his real sign-in put in the audit
    bodies = [(row["principal"], json.loads(row["body"])) for row in audit_rows(benv.config.audit_path)]
    subs = {sub for sub, body in bodies if body.get("action") == "sign_in" and body.get("name") == "bob"}
    assert len(subs) == 1, subs
    cookie = {c["name"]: c["value"] for c in await page.context.cookies() if c["name"] == SESSION_COOKIE}
    tls = ssl.create_default_context(cafile=str(benv.ca_file))
    async with httpx.AsyncClient(verify=tls, cookies=cookie, headers={"accept": "text/html"}) as http:
        assert (await http.get(base(benv) + "/admin/approvals")).status_code == 200  # the browser's session
        argv = ["console", "sign-out", "--sub", subs.pop(), "--config", str(benv.config_path)]
        assert await asyncio.to_thread(cli, argv) == 0
        r = await http.get(base(benv) + "/admin/approvals")
    assert r.status_code == 303 and r.headers["location"].startswith("/admin/login"), r
    await page.context.close()


async def test_the_console_works_at_phone_width(
    bgw: GatewayThread, benv: DevEnv, keycloak: Any, browser: Any, shots: Path
) -> None:
    url = await agent_pending(benv, keycloak)
    page = await new_page(browser, phone=True)
    await sign_in_at(page, url, keycloak, "alice")

    async def fits() -> bool:
        return bool(await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))

    assert await fits(), "the request page scrolls sideways at phone width"
    assert await page.locator("#approve").is_visible()
    await shot(page, shots, "phone-approval")
    for path in ("/admin/approvals", "/admin/audit"):
        await page.goto(base(benv) + path)
        assert await fits(), f"{path} scrolls sideways at phone width"
    await shot(page, shots, "phone-audit", full_page=False)
    await page.context.close()
