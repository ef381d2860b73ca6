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
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.admin.console import views
from gateway.dev.devenv import DevEnv
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.pgsync import audit_location
from tests.console.conftest import Browser, Browsers, console_env, console_policy, human
from tests.support import GatewayThread, audit_rows

ERIN = human("erin", ["auditor"], [])  # every section
GUS = human("gus", ["auditor"], [])  # the cut exports' own people: their records are theirs alone
HAL = human("hal", ["auditor"], [])
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
def erin(wgw: GatewayThread, wenv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(wenv, ERIN)


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
    *lines, end = [json.loads(x) for x in export.text.splitlines()]
    assert len(lines) == EXPORT_CUT + 2
    seqs = [line["seq"] for line in lines]
    assert seqs == sorted(set(seqs)) and all(line["request_id"] == "export-all" for line in lines)
    # a whole export ends with its trailer: the last record it covers, and how many lines came before it
    assert end == {"export_end": {"up_to_seq": seqs[-1], "records": EXPORT_CUT + 2}}
    # the export's own record names the filters and the last record it covers, written as it begins
    *tail, tail_end = erin.get("/admin/audit/export", params={"kind": "console", "principal": "erin"}).text.splitlines()
    assert "export_end" in json.loads(tail_end)
    began, whole = (json.loads(x) for x in tail[-2:])  # the first export's two records, one request id
    body = began["body"]
    assert body["action"] == "audit_export" and body["filters"] == {"request_id": "export-all"}
    assert body["up_to_seq"] == seqs[-1] and began["outcome"] == "started"
    # once its trailer went out, its end: `ok` with the records it wrote (none recorded as cut)
    assert whole["outcome"] == "ok" and whole["request_id"] == began["request_id"]
    assert whole["body"]["records"] == EXPORT_CUT + 2 and "reason" not in whole["body"]
    assert [r["outcome"] for r in _export_records(wenv, "erin")] == ["started", "ok", "started", "ok"]


def _export_records(env: DevEnv, principal: str) -> list[dict[str, Any]]:
    """The audit_export records of `principal`, oldest first, straight from the file."""
    rows = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "console" and r["principal"] == principal]
    return [{**r, "body": json.loads(r["body"])} for r in rows if json.loads(r["body"])["action"] == "audit_export"]


def test_an_export_cut_by_a_batch_that_cannot_be_read_has_no_trailer_and_is_audited_as_cut(
    wgw: GatewayThread, wenv: DevEnv, monkeypatch: pytest.MonkeyPatch, browsers: Browsers
) -> None:
    """The database fails under a running export (its second batch cannot be read): the stream ends with an
    error line and no trailer, so a consumer knows it is incomplete, and the audit says the export was cut
    (it used to say `ok`, and the stream ended as a whole one does)."""
    write(wenv, decisions(25, "deny", request_id="export-cut"))
    monkeypatch.setattr(views, "EXPORT_BATCH", 10, raising=False)
    reads = 0

    def failing(path: Any, q: auditlib.Query) -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        if reads == 2:  # as SQLite says it when the disk fails under a read
            raise sqlite3.OperationalError("disk I/O error")
        return auditlib.search(path, q)

    monkeypatch.setattr(views, "_export_batch", failing, raising=False)
    export = browsers(wenv, GUS).get("/admin/audit/export", params={"request_id": "export-cut"})
    assert export.status_code == 200
    lines = [json.loads(x) for x in export.text.splitlines()]
    assert [line.get("request_id") for line in lines[:10]] == ["export-cut"] * 10
    assert len(lines) == 11 and set(lines[-1]) == {"export_error"}  # the first batch, then why it stops
    assert "disk I/O" not in export.text and "Traceback" not in export.text  # no internal detail
    assert not any("export_end" in line for line in lines)
    started, cut = _export_records(wenv, "gus")
    assert started["outcome"] == "started" and cut["outcome"] == "interrupted"
    assert cut["request_id"] == started["request_id"]  # the two records of one export
    assert cut["body"]["records"] == 10 and cut["body"]["up_to_seq"] == started["body"]["up_to_seq"]
    assert cut["body"]["filters"] == {"request_id": "export-cut"}


def test_an_export_the_client_leaves_is_audited_as_cut(
    wgw: GatewayThread, wenv: DevEnv, monkeypatch: pytest.MonkeyPatch, browsers: Browsers
) -> None:
    """The client goes away after the first lines: the export never reached its end, and the audit says so."""
    write(wenv, decisions(EXPORT_CUT, "deny", request_id="export-left"))
    monkeypatch.setattr(views, "EXPORT_BATCH", 100, raising=False)  # many batches: the client leaves in the middle
    browser = browsers(wenv, HAL)
    with browser.http.stream("GET", browser.base + "/admin/audit/export", params={"request_id": "export-left"}) as r:
        assert r.status_code == 200
        first = next(r.iter_lines())
        assert json.loads(first)["request_id"] == "export-left"
    browser.close()  # the client leaves (the factory's own close at teardown is too late for the wait below)
    deadline = time.monotonic() + 20
    while len(records := _export_records(wenv, "hal")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    started, cut = records
    assert started["outcome"] == "started" and cut["outcome"] == "interrupted"
    assert cut["request_id"] == started["request_id"] and 0 <= cut["body"]["records"] < EXPORT_CUT
