"""The plain approval page (the admin API's, served when the console is off) shows hidden characters as escapes.

The console writes every value through `visible()`: a bidi override, a zero-width space, a C1 control in an
agent's name or arguments is shown as its \\uXXXX escape, so the approver reads what is there. The plain
page at the same URL (what `approve_url` opens on a gateway with admin.token and no console) wrote the
requester, the guest's name and the reason through html.escape only, and its "Show arguments" wrote the
request's JSON as JSON.stringify gives it: a right-to-left override in the agent's subject (which some
providers let a client choose) or in an argument reached the approver's browser raw and reordered what
they read before they approved. Both now escape what a reader would not see as itself.

Debian's Chromium driven by Playwright against the real gateway, OPA and simulator (no console: the
approvals tests' environment, on this package's simulator).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, approvals_env, outcome, write_policy_data
from tests.support import GatewayThread

playwright_api = pytest.importorskip("playwright.async_api")

CHROMIUM = os.environ.get("PVEGATE_CHROMIUM", "/usr/bin/chromium")
AGENT = "demo-\u202eagent\u200b"  # a right-to-left override and a zero-width space in the agent's subject
SHOWN = "demo-\\u202eagent\\u200b"


def hidden_in(text: str) -> list[str]:
    """The characters of `text` a reader would not see as themselves (layout whitespace aside)."""
    return sorted(
        {f"U+{ord(ch):04X}" for ch in text if ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Cs")}
    )


@pytest.fixture(scope="module")
def penv(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    policy = write_policy_data(tmp_path_factory.mktemp("ppolicy"))
    return approvals_env(csim, policy, tmp_path_factory.mktemp("pgw"))


@pytest.fixture(scope="module")
def pgw(penv: DevEnv) -> Iterator[GatewayThread]:
    assert not penv.config.console.enabled and penv.config.admin.token is not None
    gw = GatewayThread(penv.config).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: run `make tools` (scripts/provision-chromium.sh)")
    async with playwright_api.async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        await b.close()


async def test_the_plain_page_shows_hidden_characters_as_escapes(
    pgw: GatewayThread, penv: DevEnv, chromium: Any
) -> None:
    api = Api(penv)
    res = await api.call(api.agent(AGENT), "vm_shutdown", {"vmid": 100, "timeout": 77})
    assert outcome(res) == "pending_approval", res
    url = res["structuredContent"]["approval"]["approve_url"]
    ctx = await chromium.new_context(ignore_https_errors=True)
    try:
        page = await ctx.new_page()
        await page.goto(url)
        facts = await page.inner_text("table")
        assert "Requested by" in facts and SHOWN in facts, facts
        assert hidden_in(facts) == [], hidden_in(facts)
        # the request's JSON, loaded with an approver's own token
        await page.fill("#tok", api.human("alice", ["sre-leads"]))
        await page.click("#load")
        await page.wait_for_function("document.getElementById('out').textContent.startsWith('200')")
        out = await page.inner_text("#out")
        assert SHOWN in out and '"vmid": 100' in out, out
        assert hidden_in(out) == [], hidden_in(out)
    finally:
        await ctx.close()
