"""The console's queue pages through every open request (regression: its default "open" view took the
300 newest rows of every state and only then kept the open ones, so one agent's few hundred held
calls hid another requester's live request until it expired)."""

from __future__ import annotations

import asyncio
import html
import re

from gateway.dev.devenv import DevEnv
from gateway.store.approvals import ApprovalStore
from gateway.store.db import database
from tests.approvals.test_queue_paging import flood, held
from tests.console.conftest import Browsers, human
from tests.support import GatewayThread

CAROL = human("carol", ["approver"], ["sre-leads"])


def test_the_open_queue_pages_to_every_live_request(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    async def seed() -> list[str]:
        s = ApprovalStore(database(cenv.config))
        await s.open()
        try:
            victim, _ = await s.find_or_create(held("victim-agent", 0))
            return [victim.id, *await flood(s, 320)]
        finally:
            await s.close()

    async def cleanup(ids: list[str]) -> None:
        s = ApprovalStore(database(cenv.config))
        await s.open()
        try:
            for aid in ids:
                await s.withdraw(aid, "operator", "test cleanup")
        finally:
            await s.close()

    mine = asyncio.run(seed())
    carol = browsers(cenv, CAROL)
    try:
        page = carol.get("/admin/approvals")
        assert page.status_code == 200, page.text
        assert f'data-id="{mine[0]}"' in page.text  # the soonest to expire is on the first page
        seen: list[str] = []
        pages = 0
        while True:
            pages += 1
            seen += re.findall(r'<tr data-id="([^"]+)"', page.text)
            more = re.search(r'<a id="more" href="([^"]+)"', page.text)
            if more is None:
                break
            assert pages < 20
            page = carol.get(html.unescape(more.group(1)))
            assert page.status_code == 200 and 'id="first"' in page.text
        assert pages >= 4 and len(seen) == len(set(seen)) and set(mine) <= set(seen)

        pending = carol.get("/admin/approvals?state=pending")
        assert f'data-id="{mine[0]}"' in pending.text and 'id="more"' in pending.text
        assert carol.get("/admin/approvals?state=open&cursor=garbage").status_code == 400
    finally:
        asyncio.run(cleanup(mine))
