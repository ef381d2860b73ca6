"""Windows over a large audit: the status page's decision rates are the newest records of their window
(they were the oldest 20,000, so a busy quarter hour showed its start and hid the last minutes), and the
console's export has every matching record (it was cut at 50,000 without a word).

Its own gateway (its audit is filled with tens of thousands of records here), on the package's
simulator; the records are written by the gateway's own AuditLog."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.admin.console import views
from gateway.dev.devenv import DevEnv
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.pgsync import audit_location
from tests.console.conftest import Browser, console_env, console_policy, human
from tests.support import GatewayThread

ERIN = human("erin", ["auditor"], [])  # every section
RATES_WINDOW = 20_000  # the decisions the status page reads at most
EXPORT_CUT = 50_000  # where the export used to stop


@pytest.fixture(scope="module")
def wenv(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return console_env(tmp_path_factory, csim, "w", console_policy(tmp_path_factory.mktemp("wpolicy")))


@pytest.fixture(scope="module")
def wgw(wenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(wenv.config).start()
    yield gw
    gw.stop()


@pytest.fixture
def erin(wgw: GatewayThread, wenv: DevEnv) -> Iterator[Browser]:
    b = Browser(wenv, ERIN)
    yield b
    b.close()


def write(env: DevEnv, records: list[AuditRecord]) -> None:
    async def run() -> None:
        log = AuditLog(audit_location(env.config), head_key=env.config.audit_key_path)
        await log.open()
        try:
            for at in range(0, len(records), 5_000):
                await log.append(*records[at : at + 5_000])
        finally:
            await log.close()

    asyncio.run(run())


def decisions(n: int, outcome: str, request_id: str = "bulk") -> list[AuditRecord]:
    return [AuditRecord(request_id, "decision", "agent", "vm_stop", "default/qemu/101", outcome, {}) for _ in range(n)]


def test_the_rates_are_the_newest_decisions_of_their_window(erin: Browser, wenv: DevEnv) -> None:
    write(wenv, decisions(RATES_WINDOW, "zz_older"))
    write(wenv, decisions(3, "zz_newest"))
    page = erin.get("/admin/status")
    assert page.status_code == 200
    totals = dict(re.findall(r'<span class="badge (zz_\w+)">zz_\w+ (\d+)</span>', page.text))
    assert totals.get("zz_newest") == "3", totals  # the last minutes are on the page
    assert sum(int(v) for v in totals.values()) <= RATES_WINDOW
    # and the page says the window holds more than it counted
    assert 'id="rates-cut"' in page.text and f"newest {RATES_WINDOW:,}" in html.unescape(page.text)


def test_the_export_has_every_matching_record(erin: Browser, wenv: DevEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    write(wenv, decisions(EXPORT_CUT + 2, "deny", request_id="export-all"))
    monkeypatch.setattr(views, "EXPORT_BATCH", 7_000, raising=False)  # batches that do not divide the records
    export = erin.get("/admin/audit/export", params={"request_id": "export-all"})
    assert export.status_code == 200 and "attachment" in export.headers["content-disposition"]
    lines = [json.loads(x) for x in export.text.splitlines()]
    assert len(lines) == EXPORT_CUT + 2
    seqs = [line["seq"] for line in lines]
    assert seqs == sorted(set(seqs)) and all(line["request_id"] == "export-all" for line in lines)
    # the export's own record names the filters and the last record it covers
    tail = erin.get("/admin/audit/export", params={"kind": "console", "principal": "erin"}).text.splitlines()
    body = json.loads(tail[-1])["body"]
    assert body["action"] == "audit_export" and body["filters"] == {"request_id": "export-all"}
    assert body["up_to_seq"] == seqs[-1]
