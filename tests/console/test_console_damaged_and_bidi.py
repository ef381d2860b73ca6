"""The console shows what is there: a damaged audit record is shown (and exported) with what is wrong
with it instead of failing the audit pages, and the characters a reader would not see as themselves
(bidi overrides, zero-width ones, C1 controls) in an agent's arguments, reasons and name are shown as
their \\uXXXX escapes, never obeyed by the approver's browser.

Its own gateway (its audit is damaged here on purpose), on the package's simulator; sessions are
cookies signed with the session key, as in test_pages.py."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import unicodedata
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.admin.console import views
from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, outcome
from tests.console.conftest import CAROL, Browser, Browsers, console_env, console_policy, human
from tests.support import GatewayThread, sqlite_exec

ERIN = human("erin", ["auditor"], [])

# a right-to-left override and isolate, zero-width space, no-break, RLM, byte order mark, a C1 control (CSI),
# a tag character: each renders as nothing, or reorders what follows it
HIDDEN = "\u202e\u2066\u200b\u200d\u200f\ufeff\x9b\U000e0041"
DESCRIPTION = f"harmless note {HIDDEN[:2]} ]tnempoleved[ {HIDDEN[2:]} end"
SHOWN = "harmless note \\u202e\\u2066 ]tnempoleved[ \\u200b\\u200d\\u200f\\ufeff\\u009b\\udb40\\udc41 end"


def hidden_in(text: str) -> list[str]:
    """The characters of `text` a reader would not see as themselves (layout whitespace aside)."""
    return sorted(
        {f"U+{ord(ch):04X}" for ch in text if ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Cs")}
    )


def describing_prod_needs_a_lead(data: dict[str, Any]) -> None:
    data["approval"]["rules"].append(
        {
            "name": "test-prod-description",
            "tools": ["guest_description_set"],
            "target_tags": ["prod"],
            "reason": "describing a prod guest needs an SRE lead",
            "approver_groups": ["sre-leads"],
        }
    )


@pytest.fixture(scope="module")
def denv(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    root = tmp_path_factory.mktemp("dpolicy")
    policy = console_policy(root, approver_sections="all", edit=describing_prod_needs_a_lead)
    return console_env(tmp_path_factory, csim, "d", policy)


@pytest.fixture(scope="module")
def dgw(denv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(denv.config).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def api(dgw: GatewayThread, denv: DevEnv) -> Api:
    return Api(denv)


@pytest.fixture
def carol(dgw: GatewayThread, denv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(denv, CAROL)


@pytest.fixture
def erin(dgw: GatewayThread, denv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(denv, ERIN)


def pre(page: str, pid: str) -> str:
    m = re.search(f'<pre id="{pid}">(.*?)</pre>', page, re.S)
    assert m is not None, page[:2000]
    return m.group(1)


# --- the rendering filters ------------------------------------------------------------------


def test_pretty_shows_hidden_characters_as_escapes_and_stays_json() -> None:
    value = {"description": DESCRIPTION, "name\u202e": "\udcff", "plain": "été 中文 😀"}
    shown = views._env.filters["pretty"](value)
    assert hidden_in(shown) == []
    for escape in ("\\u202e", "\\u2066", "\\u200b", "\\u200f", "\\ufeff", "\\u009b", "\\udb40\\udc41", "\\udcff"):
        assert escape in shown
    assert "été 中文 😀" in shown  # readable text stays as it is
    assert json.loads(shown) == value  # the escapes are JSON's: the same value


@pytest.mark.parametrize("ts", ["x", "nan", float("nan"), float("-inf"), b"\xff", [1]])
def test_time_filters_show_a_question_mark_for_a_time_that_is_no_time(ts: Any) -> None:
    for name in ("when", "day", "clock", "ago"):
        assert views._env.filters[name](ts) == "?", name


@pytest.mark.parametrize("ts", [1e300, -1e300, 2**70])
def test_a_time_out_of_range_is_a_question_mark_too(ts: Any) -> None:
    for name in ("when", "day", "clock"):
        assert views._env.filters[name](ts) == "?", name


def test_every_rendered_value_is_shown_visibly() -> None:
    page = views._env.from_string("<p>{{ who }}</p><p>{{ reasons | join(', ') }}</p>").render(
        who="agent\u202egnp.exe", reasons=["ok\u2067", "\x85"]
    )
    assert hidden_in(page) == []
    assert "agent\\u202egnp.exe" in page and "ok\\u2067, \\u0085" in page


# --- against the gateway --------------------------------------------------------------------


def test_the_approval_page_shows_hidden_characters_in_arguments_as_escapes(
    api: Api, carol: Browser, erin: Browser
) -> None:
    args = {"vmid": 100, "description": DESCRIPTION}
    res = asyncio.run(api.call(api.agent(), "guest_description_set", args))
    assert outcome(res) == "pending_approval", res
    aid = res["structuredContent"]["approval"]["id"]
    r = carol.get(f"/admin/approvals/{aid}")
    assert r.status_code == 200
    assert hidden_in(r.text) == []
    for pid in ("arguments", "preview"):
        text = pre(r.text, pid)
        assert SHOWN in text
    # the audit of that call, list and records, shows them the same way
    m = re.search(r'href="/admin/audit\?request_id=([0-9A-Za-z_-]+)"', r.text)
    assert m is not None
    rid = m.group(1)
    listing = erin.get("/admin/audit", params={"request_id": rid})
    assert listing.status_code == 200 and hidden_in(listing.text) == []
    seqs = re.findall(r'href="/admin/audit/record/(\d+)"', listing.text)
    assert seqs
    for seq in seqs:
        page = erin.get(f"/admin/audit/record/{seq}")
        assert page.status_code == 200 and hidden_in(page.text) == [], seq


def _rows(env: DevEnv) -> list[dict[str, Any]]:
    con = sqlite3.connect(env.config.audit_path)
    con.row_factory = sqlite3.Row
    con.text_factory = bytes
    try:
        return [
            {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in dict(r).items()}
            for r in con.execute("SELECT * FROM audit ORDER BY seq")
        ]
    finally:
        con.close()


def _export(erin: Browser, request_id: str) -> list[dict[str, Any]]:
    r = erin.get("/admin/audit/export", params={"request_id": request_id})
    assert r.status_code == 200, r.text[:300]
    *lines, end = [json.loads(line) for line in r.text.splitlines()]
    assert end["export_end"]["records"] == len(lines)  # a damaged record does not cut the export
    return lines


def _damaged_seq(api: Api, denv: DevEnv) -> tuple[int, str]:
    res = asyncio.run(api.call(api.agent(), "list_guests", {}))
    assert outcome(res) == "allowed", res
    rid = res["_meta"]["pvegate/request_id"]
    return next(int(row["seq"]) for row in _rows(denv) if row["request_id"] == rid and row["kind"] == "result"), rid


def test_a_record_whose_body_is_no_object_is_shown_and_exported_with_its_damage(
    api: Api, erin: Browser, denv: DevEnv
) -> None:
    seq, rid = _damaged_seq(api, denv)
    sqlite_exec(denv.config.audit_path, f"UPDATE audit SET body = '[]' WHERE seq = {seq}")
    lines = _export(erin, rid)
    bad = [line for line in lines if line.get("seq") == seq]
    assert len(bad) == 1 and bad[0]["request_id"] == rid
    assert "its body is not a JSON object" in bad[0]["error"] and "body" not in bad[0]
    assert any(line.get("kind") == "decision" for line in lines)  # the others of the request are exported
    page = erin.get(f"/admin/audit/record/{seq}")
    assert page.status_code == 200
    assert 'id="damaged"' in page.text and "its body is not a JSON object" in page.text
    assert pre(page.text, "body") == "[]"  # the record as stored
    listing = erin.get("/admin/audit", params={"request_id": rid})
    assert listing.status_code == 200 and "damaged" in listing.text


def test_a_record_whose_time_is_no_time_is_shown_and_exported_with_its_damage(
    api: Api, erin: Browser, denv: DevEnv
) -> None:
    seq, rid = _damaged_seq(api, denv)
    sqlite_exec(denv.config.audit_path, f"UPDATE audit SET ts = 'x' WHERE seq = {seq}")
    for path in ("/admin/audit", "/admin/status"):
        assert erin.get(path).status_code == 200, path
    listing = erin.get("/admin/audit", params={"request_id": rid})
    assert listing.status_code == 200
    row = re.search(rf'<tr>\s*<td><a href="/admin/audit/record/{seq}">.*?</tr>', listing.text, re.S)
    assert row is not None and "damaged" in row.group(0) and "?" in row.group(0)
    bad = [line for line in _export(erin, rid) if line.get("seq") == seq]
    assert len(bad) == 1 and "its time is not a number" in bad[0]["error"]
    page = erin.get(f"/admin/audit/record/{seq}")
    assert page.status_code == 200 and "its time is not a number" in page.text


def test_a_record_with_bytes_that_are_no_text_is_shown(api: Api, erin: Browser, denv: DevEnv) -> None:
    seq, rid = _damaged_seq(api, denv)
    sqlite_exec(
        denv.config.audit_path,
        f"UPDATE audit SET principal = CAST(X'61ff62' AS TEXT), target = X'00ff' WHERE seq = {seq}",
    )
    listing = erin.get("/admin/audit", params={"request_id": rid})
    assert listing.status_code == 200 and hidden_in(listing.text) == []
    assert "a\\udcffb" in listing.text  # the undecodable byte, shown
    page = erin.get(f"/admin/audit/record/{seq}")
    assert page.status_code == 200 and 'id="damaged"' in page.text
    bad = [line for line in _export(erin, rid) if line.get("seq") == seq]
    assert len(bad) == 1 and "error" in bad[0]


def test_a_refused_sign_in_whose_row_cannot_be_written_is_a_503(
    dgw: GatewayThread, denv: DevEnv, browsers: Browsers
) -> None:
    """Anyone may send a sign-in answer; its refusal is audited. With a row past the audit's head
    (added by another hand) every write is refused: the sign-in is refused with a 503, not a 500."""
    con = sqlite3.connect(denv.config.audit_path)
    (top,) = con.execute("SELECT max(seq) FROM audit").fetchone()
    con.close()
    row = f"{top + 1}, 1.0, 'forged', 'decision', 'p', 't', NULL, 'allow', '{{}}', '00', '00'"
    forged = f"INSERT INTO audit VALUES ({row})"
    sqlite_exec(denv.config.audit_path, forged)
    try:
        r = browsers(denv, None).get("/admin/callback?state=x&code=y")
        assert r.status_code == 503, (r.status_code, r.text[:500])
        assert "audit store cannot take writes" in r.text
    finally:
        sqlite_exec(denv.config.audit_path, f"DELETE FROM audit WHERE seq = {top + 1}")


def test_blank_glyphs_are_shown_and_safe_html_is_not_escaped_twice() -> None:
    from markupsafe import Markup

    from gateway.core.text import visible

    assert visible("alice\u3164") == "alice\\u3164" and visible("\u2800") == "\\u2800"  # look like nothing
    assert views._shown(Markup("<b>x\u202e</b>")) == Markup("<b>x\\u202e</b>")
    assert views._env.from_string("{{ v }}").render(v=Markup("<b>x\n</b>")) == "<b>x\n</b>"
