"""No vote is decided while the policy data is invalid (found in review).

The data check (data.pvegate.data_check) used to gate only tools/call decisions: an approver's
vote asked data.pvegate.approver.decision on the broken data. With the step-up limits' level
names capitalised (`Critical: 300`: unknown keys, schema-invalid, so every call is refused with
data.invalid), the approver policy found no step-up limit, took a vote with an hour-old sign-in
and minted a token the agent redeemed once the data was fixed, though the valid data demands a
sign-in within 300 s. Now the vote is refused with the words and code every call gets then,
the request stays pending, and once the data is fixed it is voted on under the valid data.
tools/list shows nothing and the console opens no section meanwhile (the data decides both).

The real gateway, its managed OPA and a simulator of its own (the approved call runs on it).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import jwt
import pytest
import yaml

from gateway.dev.devenv import AUDIENCE, ISSUER
from gateway.mcp.methods import POLICY_UNAVAILABLE
from gateway.policy.decisions import Unanswered
from tests.approvals.conftest import Api, approvals_env, outcome, write_policy_data
from tests.support import GatewayThread

pytestmark = pytest.mark.asyncio

LEVELS = ("low", "medium", "high", "critical")
AUDITOR = {
    "sub": "kc-auditor",
    "iss": ISSUER,
    "client_id": "pvegate-console",
    "roles": ["auditor"],
    "groups": [],
    "scopes": [],
    "kind": "human",
}
_ids = itertools.count(1)


def _data(root: Path, capitalised: bool) -> Path:
    """The approvals tests' data with a 300 s step-up on every level; `capitalised` spells the
    levels `Critical` etc.: unknown keys, so the data check refuses the data."""
    write_policy_data(root)
    f = root / "data" / "data.yaml"
    d = yaml.safe_load(f.read_text())
    d["approval"]["step_up_max_age_seconds_by_level"] = {
        (lvl.capitalize() if capitalised else lvl): 300 for lvl in LEVELS
    }
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return root


def _human(secret: str, sub: str, groups: list[str], signed_in_ago: int) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": sub,
        "iat": now - signed_in_ago,
        "nbf": now - signed_in_ago,
        "exp": now + 3600,
        "roles": [],
        "groups": groups,
        "scope": "",
        "pvegate_kind": "human",
    }
    return jwt.encode(claims, secret, algorithm="HS256")


async def _tools_list(api: Api) -> list[str] | None:
    """The names listed; None when the gateway says the policy decision is unavailable (503)."""
    body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {api.agent()}", "MCP-Protocol-Version": "2025-06-18"}
    async with api.client() as http:
        r = await http.post(api.env.url, json=body, headers=headers)
    if r.status_code == 503:
        assert r.json()["error"]["code"] == POLICY_UNAVAILABLE, r.text
        assert "Retry-After" in r.headers
        return None
    assert r.status_code == 200, r.text
    return [t["name"] for t in r.json()["result"]["tools"]]


def _console_sections(gw: GatewayThread) -> frozenset[str] | Unanswered:
    """The gateway's own decision client, on its loop, asked what the console opens to an auditor."""
    doc = {"contract_version": 1, "kind": "list", "principal": AUDITOR, "request": {}, "tools": []}
    assert gw.loop is not None
    fut = asyncio.run_coroutine_threadsafe(gw.components.decisions.console_sections(doc), gw.loop)
    return fut.result(timeout=30)


async def _state(api: Api, aid: str) -> str:
    r = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


async def test_no_vote_is_decided_while_the_policy_data_is_invalid(tmp_path: Path) -> None:
    from gateway.sim.harness import start_simulator

    sim = start_simulator("small", tmp_path / "sim", ssh=False)
    good = _data(tmp_path / "good", capitalised=False)
    bad = _data(tmp_path / "bad", capitalised=True)
    work = tmp_path / "gw"  # one state directory, secrets and database for the three gateways
    args = {"vmid": 100, "timeout": 71}
    try:
        env = approvals_env(sim, good, work)
        api = Api(env)
        gw = GatewayThread(env.config).start()
        try:
            held = await api.call(api.agent(), "vm_shutdown", args)
            assert outcome(held) == "pending_approval", held
            aid = held["structuredContent"]["approval"]["id"]
            r = await api.vote(aid, _human(env.jwt_secret, "alice", ["sre-leads"], 3600))
            assert r.status_code == 403 and "approver.step_up_required" in r.json()["codes"], r.text  # baseline
            assert "vm_shutdown" in (await _tools_list(api) or [])
            assert _console_sections(gw) == {"approvals", "audit", "policy"}
        finally:
            gw.stop()

        env = approvals_env(sim, bad, work)
        api = Api(env)
        gw = GatewayThread(env.config).start()
        try:
            refused = await api.call(api.agent(), "get_guest_status", {"vmid": 100})
            assert refused["structuredContent"]["codes"] == ["data.invalid"], refused
            words = refused["structuredContent"]["reasons"]
            for signed_in_ago in (3600, 0):  # the stale vote the broken data let through, and a fresh one
                r = await api.vote(aid, _human(env.jwt_secret, "alice", ["sre-leads"], signed_in_ago))
                assert r.status_code == 403, r.text
                assert r.json()["codes"] == ["data.invalid"] and r.json()["reasons"] == words, r.text
                assert "token" not in r.json()
            assert await _state(api, aid) == "pending"
            assert await _tools_list(api) is None  # nothing listed on broken data: the decision is unavailable
            # no console section either, and the console says why (not "the policy opens you nothing")
            assert _console_sections(gw) == Unanswered(
                "the policy data is invalid (`pvegate policy check` and /admin/health say where)"
            )
        finally:
            gw.stop()

        env = approvals_env(sim, good, work)  # the data fixed: the request is voted on under it
        api = Api(env)
        gw = GatewayThread(env.config).start()
        try:
            r = await api.vote(aid, _human(env.jwt_secret, "alice", ["sre-leads"], 3600))
            assert r.status_code == 403 and "approver.step_up_required" in r.json()["codes"], r.text
            r = await api.vote(aid, _human(env.jwt_secret, "alice", ["sre-leads"], 0))
            assert r.status_code == 200 and r.json()["state"] == "approved", r.text
            done = await api.call(api.agent(), "vm_shutdown", args, approval=r.json()["token"])
            assert outcome(done) in ("allowed", "failed"), done
        finally:
            gw.stop()
    finally:
        sim.stop()
