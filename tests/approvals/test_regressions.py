"""Regression tests for approval bugs that were planted in review and went uncaught.

- a client-sent `_meta["pvegate/approval_request"]` (the key the gateway itself sets
  after verifying a requestState) must be stripped before enforcement: with the
  stripping removed, an agent ran an approved vm_shutdown without any token;
- a vote on an expired request must be refused by the store itself, not only by the
  sweep that usually runs before it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from gateway.core.principal import Principal
from gateway.store.approvals import ApprovalRequest, ApprovalStore, target_key
from tests.approvals.conftest import Api, outcome, text
from tests.approvals.test_flow import pending, shutdown_args, sim_shutdowns

APPROVAL_REQUEST_META = "pvegate/approval_request"


async def raw_call(api: Api, token: str, params: dict[str, Any], version: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": version}
    async with api.client() as http:
        return await http.post(api.env.url, json=body, headers=headers)


async def test_client_sent_approval_request_meta_is_ignored(api: Api, asim: Any) -> None:
    args = shutdown_args()
    aid, _ = await pending(api, "vm_shutdown", args)
    vote = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    token = vote.json()["token"]

    # the agent names the approved request by id instead of presenting the token
    forged = {"name": "vm_shutdown", "arguments": args, "_meta": {APPROVAL_REQUEST_META: aid}}
    for version in ("2025-06-18", "2025-11-25"):
        r = await raw_call(api, api.agent(), forged, version)
        assert r.status_code == 200, r.text
        res = r.json()["result"]
        assert outcome(res) == "pending_approval" and res["isError"] is True, (version, res)
    assert sim_shutdowns(asim, args["timeout"]) == []  # nothing reached Proxmox
    state = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)
    assert state.json()["state"] == "approved", state.json()  # not consumed by the forged retry

    done = await api.call(api.agent(), "vm_shutdown", args, approval=token)  # the real token still works
    assert outcome(done) in ("allowed", "failed") and "already used" not in text(done), done
    assert len(sim_shutdowns(asim, args["timeout"])) == 1


def _request(expires_at: float) -> ApprovalRequest:
    now = time.time()
    target = {"cluster": "default", "node": "pve1", "vmid": 100}
    return ApprovalRequest(
        id="apr-" + uuid.uuid4().hex,
        created_at=now - 60,
        request_id=uuid.uuid4().hex,
        requester="demo-agent",
        requester_facts={},
        tool="vm_shutdown",
        tool_facts={},
        arguments_digest="sha256:" + "0" * 64,
        arguments={"vmid": 100},
        target_key=target_key(target),
        target=target,
        risk={},
        reason="test",
        approver_groups=["sre-leads"],
        min_approvals=1,
        ttl_seconds=round(expires_at - now),  # the store sets expires_at = its clock + ttl
        expires_at=expires_at,
        state="pending",
    )


async def test_store_refuses_a_vote_on_an_expired_request(tmp_path: Path) -> None:
    """No sweep (expire_due) runs here: the vote itself must see the expiry."""
    store = ApprovalStore(tmp_path / "approvals.db")
    await store.open()
    try:
        alice = Principal("alice", "test", (), ("sre-leads",), (), None, "human")
        expired, _ = await store.find_or_create(_request(time.time() - 1))
        out = await store.vote(expired.id, alice, "approve", None, None, ["sre-leads"])
        assert out.ok is False and out.token is None and "expired" in out.reasons[0], out
        again = await store.get(expired.id)
        assert again.state != "approved" and again.approvals == [], again

        live, _ = await store.find_or_create(_request(time.time() + 60))  # the control: a live one is approved
        ok = await store.vote(live.id, alice, "approve", None, None, ["sre-leads"])
        assert ok.ok and ok.state == "approved" and ok.token
    finally:
        await store.close()
