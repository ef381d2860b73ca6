"""The approval queue is the operator's view: an agent (or any JWT) cannot list it."""

from __future__ import annotations

from tests.approvals.conftest import Api


async def test_only_the_operator_lists_the_queue(api: Api) -> None:
    for token in (api.agent("rogue-agent"), api.human("alice", ["sre-leads"], ["approver"])):
        r = await api.admin("GET", "/admin/approvals?state=all", token)
        assert r.status_code == 401, r.text
        assert "approvals" not in r.text
    r = await api.admin("GET", "/admin/approvals?state=all", api.admin_token)
    assert r.status_code == 200 and "approvals" in r.json()


async def test_the_queue_filters_by_state_and_refuses_an_unknown_one(api: Api) -> None:
    for state in ("pending", "approved", "denied", "withdrawn", "expired", "used", "all"):
        r = await api.admin("GET", f"/admin/approvals?state={state}", api.admin_token)
        assert r.status_code == 200, r.text
        assert all(a["state"] == state for a in r.json()["approvals"]) or state == "all"
    r = await api.admin("GET", "/admin/approvals?state=pendng", api.admin_token)
    assert r.status_code == 400 and r.json()["error"] == "bad_state"
    assert "pending" in r.json()["detail"]
