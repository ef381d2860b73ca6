"""Four-eyes approvals end to end: real gateway, real OPA with the policy library, real simulator."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
from typing import Any

from gateway.store import audit as auditlib
from tests.approvals.conftest import Api, outcome, text
from tests.support import audit_rows, database_bytes

_timeouts = itertools.count(11)


def shutdown_args(vmid: int = 100) -> dict[str, Any]:
    return {"vmid": vmid, "timeout": next(_timeouts)}  # a unique timeout: a distinct call, visible in the sim log


def sim_shutdowns(sim: Any, timeout: int) -> list[dict[str, Any]]:
    return [
        r
        for r in sim.requests_log()
        if r["method"] == "POST"
        and r["path"].endswith("/status/shutdown")
        and str((r.get("body") or {}).get("timeout")) == str(timeout)
    ]


async def pending(api: Api, tool: str, args: dict[str, Any], agent: str = "demo-agent") -> tuple[str, dict[str, Any]]:
    res = await api.call(api.agent(agent), tool, args)
    assert outcome(res) == "pending_approval", res
    assert res["isError"] is True
    return str(res["structuredContent"]["approval"]["id"]), res


async def test_pending_approve_retry_runs_exactly_once(api: Api, asim: Any) -> None:
    args = shutdown_args()
    aid, res = await pending(api, "vm_shutdown", args)
    info = res["structuredContent"]["approval"]
    assert res["structuredContent"]["executed"] is False
    assert info["approver_groups"] == ["sre-leads"] and info["min_approvals"] == 1
    assert "approval.rule" in info["codes"]  # the stable code beside the sentence
    assert info["approve_url"].endswith(f"/admin/approvals/{aid}") and aid in info["approve_cli"]
    assert res["_meta"]["pvegate/approval_id"] == aid
    assert aid in text(res) and "pvegate/approval" in text(res) and info["expires_at"] in text(res)
    assert sim_shutdowns(asim, args["timeout"]) == []  # nothing reached Proxmox

    again, _ = await pending(api, "vm_shutdown", args)  # the identical pending request is returned
    assert again == aid

    r = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert r.status_code == 200, r.text
    token = r.json()["token"]
    assert r.json()["state"] == "approved" and len(token) >= 43  # 256 bits, urlsafe base64

    done = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(done) in ("allowed", "failed"), done  # it ran (a failure is Proxmox's answer)
    assert len(sim_shutdowns(asim, args["timeout"])) == 1
    rid = done["_meta"]["pvegate/request_id"]
    rows = audit_rows(api.env.config.audit_path, rid)
    kinds = [r["kind"] for r in rows]
    assert kinds[:3] == ["approval", "received", "decision"] and kinds[-1] == "result"
    decision = next(r for r in rows if r["kind"] == "decision")
    assert decision["outcome"] == "allow" and f'"approval_presented":"{aid}"' in decision["body"]

    replay = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(replay) == "denied" and "already used" in text(replay)
    assert len(sim_shutdowns(asim, args["timeout"])) == 1
    refusal = audit_rows(api.env.config.audit_path, replay["_meta"]["pvegate/request_id"])
    assert [(r["kind"], r["outcome"]) for r in refusal] == [("refusal", "approval_refused")]

    # the token itself is nowhere in the database; only its hash
    raw = database_bytes(api.env.config.audit_path)
    assert token.encode() not in raw


async def test_binding_mismatches_are_refused_without_burning_the_token(api: Api, asim: Any) -> None:
    args = shutdown_args()
    aid, _ = await pending(api, "vm_shutdown", args)
    token = (await api.vote(aid, api.human("alice", ["sre-leads"]))).json()["token"]
    cases = [
        (api.agent(), "vm_shutdown", {**args, "timeout": args["timeout"] + 1000}, "other arguments"),
        (api.agent(), "vm_shutdown", {**args, "vmid": 101}, "another target"),
        (api.agent(), "vm_reboot", {"vmid": 100}, "for tool vm_shutdown"),
        (api.agent("other-agent"), "vm_shutdown", args, "another principal"),
        (api.agent(), "vm_shutdown", args | {"force_stop": True}, "other arguments"),
    ]
    for tok, tool, a, why in cases:
        res = await api.call(tok, tool, a, approval=token)
        assert outcome(res) == "denied" and why in text(res), (why, text(res))
    bogus = await api.call(api.agent(), "vm_shutdown", args, approval="x" * 43)
    assert "not known" in text(bogus)
    ok = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(ok) in ("allowed", "failed") and len(sim_shutdowns(asim, args["timeout"])) == 1


async def test_fifty_concurrent_presentations_run_exactly_once(api: Api, asim: Any) -> None:
    args = shutdown_args(101)
    aid, _ = await pending(api, "vm_shutdown", args)
    token = (await api.vote(aid, api.human("alice", ["sre-leads"]))).json()["token"]
    agent = api.agent()
    async with api.client() as http:
        results = await asyncio.gather(
            *[api.call(agent, "vm_shutdown", args, approval=token, http=http) for _ in range(50)]
        )
    ran = [r for r in results if outcome(r) in ("allowed", "failed")]
    refused = [r for r in results if outcome(r) == "denied"]
    assert len(ran) == 1 and len(refused) == 49, [outcome(r) for r in results]
    assert all("already used" in text(r) for r in refused)
    assert len(sim_shutdowns(asim, args["timeout"])) == 1
    con = sqlite3.connect(api.env.config.audit_path)
    allowed = con.execute(
        "SELECT COUNT(*) FROM audit WHERE kind = 'decision' AND outcome = 'allow' AND body LIKE ?", (f"%{aid}%",)
    ).fetchone()[0]
    con.close()
    assert allowed == 1


async def test_four_eyes_group_and_kind_are_the_policys_call(api: Api) -> None:
    # a human operator asks; they may not approve their own request
    carol = api.env.token("carol", ["operator"], groups=["sre-leads"], kind="human")
    res = await api.call(carol, "vm_shutdown", shutdown_args())
    assert outcome(res) == "pending_approval"
    aid = res["structuredContent"]["approval"]["id"]
    own = await api.vote(aid, carol)
    assert own.status_code == 403 and any("four-eyes" in r for r in own.json()["reasons"])
    assert "approver.self_approval" in own.json()["codes"]
    outsider = await api.vote(aid, api.human("bob"))  # bob is in ops-approvers, not sre-leads
    assert outsider.status_code == 403 and any(
        "not in any of the approver groups" in r for r in outsider.json()["reasons"]
    )
    agent = await api.vote(aid, api.env.token("robo", ["approver"], groups=["sre-leads"]))
    assert agent.status_code == 403 and any("only humans may approve" in r for r in agent.json()["reasons"])
    state = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)
    assert state.json()["state"] == "pending" and state.json()["approvals"] == []
    refusals = [
        r
        for r in audit_rows(api.env.config.audit_path, aid)
        if r["kind"] == "approval" and r["outcome"] == "approve_refused"
    ]
    assert {r["principal"] for r in refusals} == {"carol", "bob", "robo"}


async def test_two_approvals_needed(api: Api, asim: Any) -> None:
    aid, res = await pending(api, "vm_reboot", {"vmid": 100, "node": "pve1"})
    assert res["structuredContent"]["approval"]["min_approvals"] == 2
    first = await api.vote(aid, api.human("alice"))  # alice: a listed member of ops-approvers
    assert first.status_code == 200 and first.json()["state"] == "pending" and "token" not in first.json()
    twice = await api.vote(aid, api.human("alice"))
    assert twice.status_code == 403 and any("already approved" in r for r in twice.json()["reasons"])
    early = await api.call(api.agent(), "vm_reboot", {"vmid": 100, "node": "pve1"}, approval="y" * 43)
    assert outcome(early) == "denied"
    second = await api.vote(aid, api.human("bob"))
    assert second.status_code == 200 and second.json()["state"] == "approved", second.text
    ran = await api.call(api.agent(), "vm_reboot", {"vmid": 100, "node": "pve1"}, approval=second.json()["token"])
    assert outcome(ran) in ("allowed", "failed"), ran
    view = (await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)).json()
    assert view["state"] == "used" and [a["approver"] for a in view["approvals"]] == ["alice", "bob"]


async def test_denied_and_withdrawn(api: Api) -> None:
    aid, _ = await pending(api, "vm_shutdown", args := shutdown_args())
    d = await api.vote(aid, api.human("alice", ["sre-leads"]), "deny")
    assert d.status_code == 200 and d.json()["state"] == "denied"
    late = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert late.status_code == 403 and "denied" in late.json()["reasons"][0]
    # a new call after a denial opens a new request
    aid2, _ = await pending(api, "vm_shutdown", args)
    assert aid2 != aid
    token = (await api.vote(aid2, api.human("alice", ["sre-leads"]))).json()["token"]
    w = await api.admin("POST", f"/admin/approvals/{aid2}/withdraw", api.admin_token, {"note": "changed my mind"})
    assert w.status_code == 200 and w.json()["state"] == "withdrawn"
    res = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(res) == "denied" and "withdrawn" in text(res)


async def test_expiry_of_pending_requests_and_tokens(api: Api) -> None:
    aid, _ = await pending(api, "vm_suspend", {"vmid": 100})
    await asyncio.sleep(2.2)
    late = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert late.status_code == 403 and "expired" in late.json()["reasons"][0]
    aid2, _ = await pending(api, "vm_suspend", {"vmid": 100})
    assert aid2 != aid  # the expired one is not reused
    token = (await api.vote(aid2, api.human("alice", ["sre-leads"]))).json()["token"]
    await asyncio.sleep(2.2)
    used = await api.call(api.agent(), "vm_suspend", {"vmid": 100}, approval=token)
    assert outcome(used) == "denied" and "expired" in text(used)
    listed = (await api.admin("GET", "/admin/approvals?state=expired", api.admin_token)).json()["approvals"]
    assert {aid, aid2} <= {a["id"] for a in listed}  # kept for audit
    # and each expiry is an approval record, as every transition (found by a review: none was written)
    for approval_id, was in ((aid, "pending"), (aid2, "approved")):
        rows = [r for r in audit_rows(api.env.config.audit_path, approval_id) if r["outcome"] == "expired"]
        assert len(rows) == 1 and rows[0]["kind"] == "approval", rows
        assert json.loads(rows[0]["body"])["was"] == was


async def test_credentials_are_not_interchangeable(api: Api) -> None:
    aid, _ = await pending(api, "vm_shutdown", shutdown_args())
    admin_vote = await api.vote(aid, api.admin_token)
    assert admin_vote.status_code == 403 and admin_vote.json()["error"] == "wrong_credential"
    jwt_on_operator = await api.admin("GET", "/admin/health", api.human("alice", ["sre-leads"]))
    assert jwt_on_operator.status_code == 401
    assert (await api.admin("GET", "/admin/health", None)).status_code == 401
    assert (await api.admin("GET", "/admin/health", api.admin_token)).json()["checks"]["opa"]["ok"] is True
    m = await api.admin("GET", "/admin/metrics", api.admin_token)
    assert m.status_code == 200 and 'pvegate_approvals{state="pending"}' in m.text
    assert 'pvegate_audit_records_total{kind="decision",outcome="pending"}' in m.text
    assert (await api.admin("GET", "/admin/metrics", api.human("alice", ["sre-leads"]))).status_code == 401
    async with api.client() as http:
        r = await http.post(
            api.env.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Authorization": f"Bearer {api.admin_token}"},
        )
    assert r.status_code == 401  # the admin token is no MCP credential
    failures = [r for r in audit_rows(api.env.config.audit_path) if r["kind"] == "auth_failure"]
    assert any('"surface":"admin"' in r["body"] for r in failures)


async def test_approval_page_and_operator_audit_endpoints(api: Api) -> None:
    aid, _ = await pending(api, "vm_shutdown", shutdown_args())
    async with api.client() as http:
        page = await http.get(f"{api.base}/admin/approvals/{aid}", headers={"Accept": "text/html"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert aid in page.text and "vm_shutdown" in page.text and "sre-leads" in page.text
    assert "script-src 'nonce-" in page.headers["content-security-policy"]
    assert (await api.admin("GET", f"/admin/approvals/{aid}", None)).status_code == 401  # JSON needs a credential
    v = await api.admin("GET", "/admin/audit/verify", api.admin_token)
    assert v.status_code == 200 and v.json()["ok"] is True
    recs = await api.admin("GET", "/admin/audit/records?tool=vm_shutdown&kind=decision&limit=5", api.admin_token)
    assert recs.status_code == 200 and 0 < len(recs.json()["records"]) <= 5
    assert auditlib.verify(api.env.config.audit_path).ok


async def test_audit_records_limit_is_a_positive_count(api: Api) -> None:
    """SQLite reads LIMIT -1 as no limit: a negative limit went around the 5000-row cap."""
    for value in ("-1", "0", "ten", "1.5"):
        r = await api.admin("GET", f"/admin/audit/records?limit={value}", api.admin_token)
        assert r.status_code == 400 and r.json()["error"] == "invalid_request", (value, r.text)
    r = await api.admin("GET", "/admin/audit/records?limit=1", api.admin_token)
    assert r.status_code == 200 and len(r.json()["records"]) == 1
