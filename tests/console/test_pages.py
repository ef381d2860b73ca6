"""The console's pages and server logic against the real gateway, OPA and simulator (no IdP:
the sessions are cookies signed with the configured key, as a sign-in would leave them)."""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from typing import Any

import pytest

from gateway.admin.console.session import SESSION_COOKIE, Session
from gateway.dev.devenv import DevEnv
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.pgsync import audit_location
from tests.approvals.conftest import Api, outcome
from tests.console.conftest import CAROL, STEP_UP_SECONDS, Browser, Browsers, cookie_value, human
from tests.support import GatewayThread, audit_rows

DAVE = human("dave", ["viewer"], [])  # sees the approvals, may not vote
ERIN = human("erin", ["auditor"], [])  # every section, votes on nothing

_timeouts = iter(range(200, 10_000))


@pytest.fixture
def erin(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(cenv, ERIN)


@pytest.fixture
def dave(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(cenv, DAVE)


def sign_in_on_record(env: DevEnv, sub: str) -> None:
    """The audit record a real sign-in writes before it hands out its cookie (these sessions are
    minted without one; tests/console/test_browser.py signs in for real)."""

    async def write() -> None:
        log = AuditLog(audit_location(env.config), head_key=env.config.audit_key_path)
        await log.open()
        try:
            body = {"action": "sign_in", "surface": "console", "name": sub}
            await log.append(AuditRecord("sign-in-" + sub, "console", sub, None, None, "ok", body))
        finally:
            await log.close()

    asyncio.run(write())


def pending(api: Api, vmid: int = 100) -> tuple[str, dict[str, Any], dict[str, Any]]:
    args = {"vmid": vmid, "timeout": next(_timeouts)}
    res = asyncio.run(api.call(api.agent(), "vm_shutdown", args))
    assert outcome(res) == "pending_approval", res
    return str(res["structuredContent"]["approval"]["id"]), args, res


def test_pages_need_a_session(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    anon = browsers(cenv, None)
    for path in ("/admin/approvals", "/admin/audit", "/admin/status", "/admin/tools", "/admin/whatif"):
        r = anon.get(path)
        assert r.status_code == 303, (path, r.status_code)
        assert r.headers["location"].startswith("/admin/login?next=%2Fadmin%2F"), r.headers["location"]
    r = anon.get("/admin/")
    assert r.status_code == 200 and 'href="/admin/login"' in r.text


def test_sign_in_with_the_provider_down_says_so(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    anon = browsers(cenv, None)
    r = anon.get("/admin/login?next=/admin/audit")
    assert r.status_code == 503 and "discovery document is unavailable" in r.text
    r = anon.get("/admin/callback?code=x&state=y")  # no attempt in progress in this browser
    assert r.status_code == 400 and "no attempt in progress" in r.text


def test_forged_expired_and_stale_sessions_are_refused(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    b = browsers(cenv, CAROL)
    good = b.http.cookies.get(SESSION_COOKIE)
    assert b.get("/admin/approvals").status_code == 200
    b.http.cookies.set(SESSION_COOKIE, good[:-3] + "AAA", domain="127.0.0.1", path="/")
    assert b.get("/admin/approvals").status_code == 303  # bad signature
    old = Session.start(CAROL, "carol", time.time())
    old.started = time.time() - cenv.config.console.max_session_seconds - 1
    b.http.cookies.set(SESSION_COOKIE, cookie_value(cenv, old), domain="127.0.0.1", path="/")
    assert b.get("/admin/approvals").status_code == 303  # past the absolute lifetime


def test_security_headers_forbid_scripts(carol: Browser) -> None:
    r = carol.get("/admin/approvals")
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "frame-ancestors 'none'" in csp
    assert "<script" not in r.text
    assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    css = carol.get("/admin/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def test_json_admin_api_keeps_the_shared_urls(api: Api, carol: Browser) -> None:
    aid, _, _ = pending(api)
    r = asyncio.run(api.admin("GET", "/admin/approvals", api.admin_token))
    assert r.status_code == 200 and any(a["id"] == aid for a in r.json()["approvals"])
    r = asyncio.run(api.admin("GET", f"/admin/approvals/{aid}", api.admin_token))
    assert r.status_code == 200 and r.json()["id"] == aid
    page = carol.get(f"/admin/approvals/{aid}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


def test_approve_from_the_console_and_the_agent_retry_runs(api: Api, carol: Browser, cenv: DevEnv) -> None:
    aid, args, res = pending(api)
    assert res["structuredContent"]["approval"]["approve_url"] == f"{carol.base}/admin/approvals/{aid}"
    queue = carol.get("/admin/approvals")
    assert queue.status_code == 200 and f'data-id="{aid}"' in queue.text
    page = carol.get(f"/admin/approvals/{aid}")
    assert page.status_code == 200
    text = html.unescape(page.text)
    facts = ("vm_shutdown", "shutting down a prod guest needs an SRE lead", "approval.rule", '"vmid": 100', "ha_state")
    for fact in facts:
        assert fact in text, fact
    assert "would_send" in text and "/status/shutdown" in text  # the dry run, nothing sent
    assert 'id="may-not"' not in page.text
    r = carol.post(f"/admin/approvals/{aid}/vote", {"csrf": carol.csrf, "verdict": "approve", "note": "ok by me"})
    assert r.status_code == 200, r.text
    assert "the request is <b>approved</b>" in r.text
    token = r.text.split('<div class="token" id="token">', 1)[1].split("</div>", 1)[0]
    done = asyncio.run(api.call(api.agent(), "vm_shutdown", args, approval=token))
    assert outcome(done) in ("allowed", "failed"), done
    votes = [
        json.loads(row["body"])
        for row in audit_rows(cenv.config.audit_path)
        if row["kind"] == "console" and row["principal"] == "carol"
    ]
    assert any(v["action"] == "vote" and v["approval_id"] == aid and v["verdict"] == "approve" for v in votes)


def test_a_completing_vote_shows_its_token_even_when_the_page_fails(
    api: Api, carol: Browser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is shown once, on the page after the vote: a page that failed to render (a preview or
    audit read raising) answered a generic 500, and the approval could never be used."""
    from gateway.admin.console import views

    aid, args, _ = pending(api)

    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError("the page's preview failed")

    monkeypatch.setattr(views, "_approval_view", broken)
    r = carol.post(f"/admin/approvals/{aid}/vote", {"csrf": carol.csrf, "verdict": "approve"})
    assert r.status_code == 200, r.text
    text = html.unescape(r.text)
    assert "is recorded; the request is approved" in text and "RuntimeError" not in text
    token = text.split("valid until ", 1)[1].split("): ", 1)[1].split("<", 1)[0].strip()
    done = asyncio.run(api.call(api.agent(), "vm_shutdown", args, approval=token))
    assert outcome(done) in ("allowed", "failed"), done


def test_a_vote_without_the_csrf_token_is_refused(api: Api, carol: Browser) -> None:
    aid, _, _ = pending(api, vmid=100)
    for form in ({"verdict": "approve"}, {"csrf": "wrong", "verdict": "approve"}):
        r = carol.post(f"/admin/approvals/{aid}/vote", form)
        assert r.status_code == 403 and "CSRF" in r.text
    r = carol.post(
        f"/admin/approvals/{aid}/vote",
        {"csrf": carol.csrf, "verdict": "approve"},
        headers={"origin": "https://evil.example"},
    )
    assert r.status_code == 403
    state = asyncio.run(api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)).json()["state"]
    assert state == "pending"
    r = carol.post(f"/admin/approvals/{aid}/vote", {"csrf": carol.csrf, "verdict": "deny", "note": "cleanup"})
    assert r.status_code == 200 and "<b>denied</b>" in r.text


def test_a_viewer_cannot_vote_and_sees_why(api: Api, dave: Browser) -> None:
    aid, _, _ = pending(api)
    page = dave.get(f"/admin/approvals/{aid}")
    assert 'id="may-not"' in page.text and "dave is not in any of the approver groups" in page.text
    r = dave.post(f"/admin/approvals/{aid}/vote", {"csrf": dave.csrf, "verdict": "approve"})
    assert r.status_code == 403 and "Your vote was refused" in r.text
    assert "dave is not in any of the approver groups" in r.text


def test_step_up_when_the_sign_in_is_too_old(api: Api, cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    aid, _, _ = pending(api)
    stale = browsers(cenv, CAROL, auth_age=STEP_UP_SECONDS + 60)
    page = stale.get(f"/admin/approvals/{aid}")
    assert 'id="step-up-first"' in page.text and f"max_age={STEP_UP_SECONDS}" in page.text
    r = stale.post(f"/admin/approvals/{aid}/vote", {"csrf": stale.csrf, "verdict": "approve"})
    assert r.status_code == 403 and 'id="step-up"' in r.text
    assert f"max_age={STEP_UP_SECONDS}" in r.text and "within the last 300 seconds" in r.text
    fresh = browsers(cenv, CAROL, auth_age=1)
    r = fresh.post(f"/admin/approvals/{aid}/vote", {"csrf": fresh.csrf, "verdict": "approve"})
    assert r.status_code == 200 and "<b>approved</b>" in r.text


def test_audit_search_detail_export_and_chain(api: Api, carol: Browser, cenv: DevEnv) -> None:
    aid, _, _ = pending(api)
    rid = next(
        row["request_id"]
        for row in audit_rows(cenv.config.audit_path)
        if row["kind"] == "approval" and json.loads(row["body"]).get("approval_id") == aid
    )
    r = carol.get("/admin/audit", params={"request_id": rid})
    assert r.status_code == 200 and 'id="chain"' in r.text and "verified" in r.text
    again = carol.get("/admin/audit", params={"verify": "1"})  # verified afresh, not the kept result
    assert "verified</b>" in again.text and 'id="verify-now"' in again.text and "Checked 0s ago" in again.text
    assert ">decision<" in r.text and ">pending<" in r.text
    seq = int(r.text.split('href="/admin/audit/record/', 1)[1].split('"', 1)[0])
    detail = carol.get(f"/admin/audit/record/{seq}")
    assert detail.status_code == 200 and rid in detail.text
    decision_seq = next(row["seq"] for row in audit_rows(cenv.config.audit_path, rid) if row["kind"] == "decision")
    d = carol.get(f"/admin/audit/record/{decision_seq}")
    assert "Bundle revision" in d.text and "Decision id" in d.text and "shutting down a prod guest" in d.text
    for past_the_end in (2**63 - 1, 2**63, 10**30):  # SQLite's integers end at 2**63 - 1: no such record
        assert carol.get(f"/admin/audit/record/{past_the_end}").status_code == 404
    assert carol.get("/admin/audit", params={"since": "yesterday"}).status_code == 400
    export = carol.get("/admin/audit/export", params={"request_id": rid, "kind": "decision"})
    assert export.status_code == 200 and "attachment" in export.headers["content-disposition"]
    *lines, end = [json.loads(x) for x in export.text.splitlines()]
    assert len(lines) == 1 and lines[0]["kind"] == "decision" and lines[0]["request_id"] == rid
    assert end["export_end"]["records"] == 1  # the trailer: the export is whole
    actions = [
        json.loads(row["body"])
        for row in audit_rows(cenv.config.audit_path)
        if row["kind"] == "console" and row["principal"] == "carol"
    ]
    assert any(a["action"] == "audit_export" and a["filters"]["request_id"] == rid for a in actions)


def test_status_shows_revision_health_and_rates(erin: Browser) -> None:
    r = erin.get("/admin/status")
    assert r.status_code == 200
    assert 'id="revision">files:' in r.text and "ready" in r.text
    assert 'id="rates"' in r.text and "Failed closed since start" in r.text


def test_tools_visible_for_a_chosen_principal(erin: Browser) -> None:
    carol = erin
    r = carol.get("/admin/tools")
    assert r.status_code == 200 and "vm_shutdown" in r.text and "POST /nodes/" in r.text
    row = r.text.split("<code>vm_shutdown</code>", 1)[1].split("</tr>", 1)[0]
    granted = row.split('<td class="hide-narrow">')[2].split("</td>", 1)[0]  # the roles granting it
    assert "operator" in granted and "admin" in granted and "viewer" not in granted
    viewer = carol.get("/admin/tools", params={"kind": "agent", "roles": "viewer"})
    assert 'id="visible-count"' in viewer.text
    seen = int(viewer.text.split('id="visible-count"', 1)[1].split("<b>", 1)[1].split("</b>", 1)[0])
    operator = carol.get("/admin/tools", params={"kind": "agent", "roles": "operator"})
    seen_op = int(operator.text.split('id="visible-count"', 1)[1].split("<b>", 1)[1].split("</b>", 1)[0])
    assert 0 < seen < seen_op  # a viewer sees fewer tools than an operator


def test_what_if_decides_without_dispatching(erin: Browser, cenv: DevEnv, csim: Any) -> None:
    carol = erin
    before = len(csim.requests_log())
    form = {
        "csrf": carol.csrf,
        "sub": "some-agent",
        "kind": "agent",
        "roles": "viewer",
        "groups": "",
        "tool": "vm_shutdown",
        "arguments": json.dumps({"vmid": 100, "timeout": 7}),
    }
    r = carol.post("/admin/whatif", form)
    assert r.status_code == 200 and 'id="decision"' in r.text and ">deny<" in r.text
    assert "rbac.not_granted" in r.text
    # the revision the decision was made under, a policy directory's too (it was "-")
    assert re.search(r'Revision <span class="mono">files:[0-9a-f]', r.text), "the policy's revision is shown"
    r = carol.post("/admin/whatif", {**form, "roles": "operator"})
    assert "approval required" in r.text and "shutting down a prod guest needs an SRE lead" in r.text
    sent = [x for x in csim.requests_log()[before:] if x["method"] != "GET"]
    assert sent == []  # decided, never dispatched
    rows = audit_rows(cenv.config.audit_path)
    assert not any(row["principal"] == "some-agent" for row in rows)  # not recorded as a call
    whatifs = [
        json.loads(row["body"])
        for row in rows
        if row["kind"] == "console" and row["principal"] == "erin" and row["outcome"] == "approval required"
    ]
    assert whatifs and whatifs[-1]["action"] == "what_if" and whatifs[-1]["as"]["roles"] == "operator"
    bad = carol.post("/admin/whatif", {**form, "arguments": "{not json"})
    assert "arguments must be a JSON object" in bad.text
    # the person's mistakes, never a 500: nesting past the parser's limit, a lone surrogate (key or value)
    deep = carol.post("/admin/whatif", {**form, "arguments": "[" * 4000})
    assert deep.status_code < 500 and "arguments must be a JSON object" in deep.text
    # what a live call's body is refused for: a name twice (read as its last copy before), NaN
    twice = carol.post("/admin/whatif", {**form, "arguments": '{"vmid": 100, "vmid": 101}'})
    assert twice.status_code < 500 and "the name &#34;vmid&#34; appears more than once" in twice.text, twice.text
    nan = carol.post("/admin/whatif", {**form, "arguments": '{"vmid": NaN}'})
    assert nan.status_code < 500 and "NaN is not a JSON value" in nan.text
    for args in ('{"vmid": 100, "\\ud800": 1}', '{"vmid": 100, "description": "\\ud800x"}'):
        odd = carol.post("/admin/whatif", {**form, "tool": "guest_config_update", "arguments": args})
        assert odd.status_code < 500 and "is not valid Unicode text" in odd.text, (args, odd.status_code)
    assert carol.post("/admin/whatif", {k: v for k, v in form.items() if k != "csrf"}).status_code == 403


def test_sign_out_clears_the_session(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> None:
    b = browsers(cenv, CAROL)
    copy = browsers(cenv, None)  # someone holding a copy of the same session cookie
    assert b.session is not None
    copy.http.cookies.set(SESSION_COOKIE, cookie_value(cenv, b.session), domain="127.0.0.1", path="/")
    assert copy.get("/admin/approvals").status_code == 200
    assert b.post("/admin/logout", {"csrf": "wrong"}).status_code == 403
    r = b.post("/admin/logout", {"csrf": b.csrf})
    assert r.status_code == 200 and "You are signed out." in r.text
    assert f'{SESSION_COOKIE}=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
    # the copy is refused from now on, although its signature and idle clock are still good
    refused = copy.get("/admin/approvals")
    assert refused.status_code == 303 and refused.headers["location"].startswith("/admin/login")
    assert browsers(cenv, CAROL).get("/admin/approvals").status_code == 200  # a new sign-in is a new session


def test_signing_out_everywhere_ends_every_session_of_that_person(
    cgw: GatewayThread, cenv: DevEnv, capsys: pytest.CaptureFixture[str], browsers: Browsers
) -> None:
    """From the console ("Sign out everywhere") or by the operator (`pvegate console sign-out`, e.g.
    for someone who left: the provider disabling them does not end a live session): every session
    of that person begun until then is refused on its next request; other people's are not, and
    a new sign-in works."""
    from gateway.cli import main as cli

    here, laptop, erin = browsers(cenv, CAROL), browsers(cenv, CAROL), browsers(cenv, ERIN)
    assert all(b.get("/admin/approvals").status_code == 200 for b in (here, laptop, erin))
    assert 'name="everywhere"' in here.get("/admin/approvals").text
    forged = here.post("/admin/logout", {"csrf": "not-this-session", "everywhere": "1"})
    assert forged.status_code == 403 and laptop.get("/admin/approvals").status_code == 200  # nothing ended
    r = here.post("/admin/logout", {"csrf": here.csrf, "everywhere": "1"})
    assert r.status_code == 200 and "You are signed out everywhere." in r.text
    gone = laptop.get("/admin/approvals")
    assert gone.status_code == 303 and gone.headers["location"].startswith("/admin/login")
    assert erin.get("/admin/approvals").status_code == 200
    time.sleep(0.01)
    again = browsers(cenv, CAROL)  # signed in afterwards
    assert again.get("/admin/approvals").status_code == 200

    sign_in_on_record(cenv, "carol")
    assert cli(["console", "sign-out", "--sub", "carol", "--config", str(cenv.config_path)]) == 0
    assert again.get("/admin/approvals").status_code == 303
    assert erin.get("/admin/approvals").status_code == 200
    assert cli(["console", "sign-out", "--sub", " ", "--config", str(cenv.config_path)]) == 2
    # a subject nobody signed in as (a typo) ends nothing and says so, naming who it may have meant
    capsys.readouterr()
    assert cli(["console", "sign-out", "--sub", "carl", "--config", str(cenv.config_path)]) == 1
    err = capsys.readouterr().err
    assert "nothing was signed out" in err and "did you mean carol" in err and "--force" in err, err
    assert cli(["console", "sign-out", "--sub", "carl", "--force", "--config", str(cenv.config_path)]) == 0
    time.sleep(0.01)
    fresh = browsers(cenv, CAROL)
    assert fresh.get("/admin/approvals").status_code == 200
    records = [
        (json.loads(row["body"])["surface"], row["outcome"])
        for row in audit_rows(cenv.config.audit_path)
        if row["kind"] == "console"
        and row["principal"] == "carol"
        and json.loads(row["body"])["action"] == "sign_out_everywhere"
    ]
    assert records[-3:] == [("console", "csrf_refused"), ("console", "ok"), ("cli", "ok")]
    forced = [r for r in audit_rows(cenv.config.audit_path) if r["kind"] == "console" and r["principal"] == "carl"]
    assert [json.loads(r["body"])["action"] for r in forced] == ["sign_out_everywhere"]  # the forced one only


def test_sections_are_the_policys_to_open(dave: Browser, carol: Browser, erin: Browser, browsers: Browsers) -> None:
    r = dave.get("/admin/audit")
    assert r.status_code == 403 and "does not open the console&#39;s audit section to dave" in r.text
    assert dave.get("/admin/audit/export").status_code == 403
    page = dave.get("/admin/approvals")
    assert 'href="/admin/approvals"' in page.text and 'href="/admin/audit"' not in page.text
    assert carol.get("/admin/audit").status_code == 200 and carol.get("/admin/whatif").status_code == 403
    assert all(erin.get(p).status_code == 200 for p in ("/admin/audit", "/admin/status", "/admin/whatif"))
    nobody = browsers(carol.env, human("mallory", ["unknown"], ["nobody"]))
    assert nobody.get("/admin/approvals").status_code == 403
    assert nobody.get("/admin/").headers["location"] == "/admin/approvals"
