"""An approval is spent only by a call that was sent (found in review).

`redeem` consumes the token (one conditional UPDATE: concurrent presentations still run at most
once) before the decision. A call refused after that without anything sent (the agent's write
quota, OPA down and failing closed, ...) used to leave it `used`: the retry the refusal asks for
was then "already used" though nothing ran. Now the refused call gives it back (`released` in the
audit), and the next presentation runs it, once.

The real gateway, its managed OPA (killed for a moment in the second test) and a simulator of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.approvals.conftest import Api, approvals_env, outcome, text, write_policy_data
from tests.approvals.test_flow import sim_shutdowns
from tests.support import GatewayThread, audit_rows

pytestmark = pytest.mark.asyncio

# the repo's agent write quota, on vm_shutdown only and small: a held call counts toward it
QUOTA = {
    "name": "agent-shutdowns-per-minute",
    "tools": ["vm_shutdown"],
    "principal_kinds": ["agent"],
    "counter": "tool",
    "window": "1m",
    "limit": 2,
}


def _policy(root: Path) -> Path:
    write_policy_data(root)
    f = root / "data" / "data.yaml"
    d = yaml.safe_load(f.read_text())
    d["quotas"] = [*d["quotas"], QUOTA]
    f.write_text(yaml.safe_dump(d, sort_keys=False))
    return root


async def _approved(api: Api, agent: str, args: dict[str, Any]) -> tuple[str, str]:
    held = await api.call(api.agent(agent), "vm_shutdown", args)
    assert outcome(held) == "pending_approval", held
    aid = str(held["structuredContent"]["approval"]["id"])
    vote = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    return aid, str(vote.json()["token"])


async def _state(api: Api, aid: str) -> dict[str, Any]:
    r = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _released(api: Api, result: dict[str, Any], aid: str) -> list[dict[str, Any]]:
    rid = result["_meta"]["pvegate/request_id"]
    rows = audit_rows(api.env.config.audit_path, rid)
    return [r for r in rows if r["kind"] == "approval" and r["outcome"] == "released" and aid in r["body"]]


@contextlib.contextmanager
def quota_gateway(tmp_path: Path) -> Iterator[tuple[Any, GatewayThread, Api]]:
    """A simulator of its own and the real gateway over it, with the small vm_shutdown quota."""
    from gateway.sim.harness import start_simulator

    sim = start_simulator("small", tmp_path / "sim", ssh=False)
    env = approvals_env(sim, _policy(tmp_path / "pol"), tmp_path / "gw")
    gw = GatewayThread(env.config).start()
    try:
        yield sim, gw, Api(env)
    finally:
        gw.stop()
        sim.stop()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Any, GatewayThread, Api]]:
    with quota_gateway(tmp_path) as g:
        yield g


async def test_a_call_refused_by_a_quota_gives_its_approval_back(gateway: Any) -> None:
    sim, _, api = gateway
    args = {"vmid": 100, "timeout": 77}
    aid, token = await _approved(api, "demo-agent", args)  # the held call counts: 1 of 2
    other = await api.call(api.agent(), "vm_shutdown", {"vmid": 102, "timeout": 5})  # a non-prod guest: 2 of 2
    assert outcome(other) in ("allowed", "failed"), other

    refused = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(refused) == "denied" and "quota.exceeded" in refused["structuredContent"]["codes"], refused
    assert sim_shutdowns(sim, args["timeout"]) == []  # nothing ran
    state = await _state(api, aid)
    assert state["state"] == "approved" and state["used_by_request"] is None, state  # not spent
    assert len(_released(api, refused, aid)) == 1

    # presented again: the quota, not "already used", still answers (and it is given back again)
    again = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(again) == "denied" and "already used" not in text(again), again
    assert (await _state(api, aid))["state"] == "approved"


async def test_a_call_refused_while_opa_is_down_gives_its_approval_back(gateway: Any) -> None:
    sim, gw, api = gateway
    agent = "night-agent"  # a principal of its own: the quota of the test above is not in the way
    args = {"vmid": 101, "timeout": 44}
    aid, token = await _approved(api, agent, args)
    sidecar = gw.components.sidecar
    sidecar.process.kill()  # OPA down for a moment (a crash, an OOM kill): calls fail closed
    sidecar.process.wait()
    refused = await api.call(api.agent(agent), "vm_shutdown", args, approval=token)
    assert outcome(refused) == "denied" and "policy.unavailable" in refused["structuredContent"]["codes"], refused
    assert (await _state(api, aid))["state"] == "approved"
    assert len(_released(api, refused, aid)) == 1

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the supervisor brings OPA back
        probe = await api.call(api.agent(agent), "list_nodes", {})
        if not probe["isError"]:
            break
        await asyncio.sleep(0.5)
    done = await api.call(api.agent(agent), "vm_shutdown", args, approval=token)
    assert outcome(done) in ("allowed", "failed") and "already used" not in text(done), done
    assert len(sim_shutdowns(sim, args["timeout"])) == 1
    state = await _state(api, aid)
    assert state["state"] == "used" and state["used_by_request"] == done["_meta"]["pvegate/request_id"], state
    assert _released(api, done, aid) == []  # sent: it stays used

    replay = await api.call(api.agent(agent), "vm_shutdown", args, approval=token)
    assert outcome(replay) == "denied" and "already used" in text(replay), replay
    assert len(sim_shutdowns(sim, args["timeout"])) == 1


async def test_a_withdrawal_while_the_call_is_decided_is_not_undone_by_its_give_back(gateway: Any) -> None:
    """The operator withdraws while the call holding the approval waits for its decision (OPA paused:
    the call fails closed and gives the approval back). The withdrawal is too late for that call, but
    the give-back must end the approval, not revive it: before the fix the retry ran the shutdown."""
    sim, gw, api = gateway
    agent = "late-withdrawal-agent"
    args = {"vmid": 101, "timeout": 33}
    aid, token = await _approved(api, agent, args)
    opa = gw.components.sidecar.process
    opa.send_signal(signal.SIGSTOP)
    try:
        call = asyncio.create_task(api.call(api.agent(agent), "vm_shutdown", args, approval=token))
        deadline = time.monotonic() + 10
        while (await _state(api, aid))["state"] != "used":  # redeemed: the call holds it
            assert time.monotonic() < deadline and not call.done(), "the call never redeemed its approval"
            await asyncio.sleep(0.02)
        late = await api.admin("POST", f"/admin/approvals/{aid}/withdraw", api.admin_token, {"note": "stop"})
        refused = await call
    finally:
        opa.send_signal(signal.SIGCONT)
    assert late.status_code == 403 and "ends withdrawn" in late.text, late.text
    assert outcome(refused) == "denied" and "policy.unavailable" in refused["structuredContent"]["codes"], refused
    assert (await _state(api, aid))["state"] == "withdrawn"
    rid = refused["_meta"]["pvegate/request_id"]
    ended = [r for r in audit_rows(api.env.config.audit_path, rid) if r["kind"] == "approval"]
    assert [r["outcome"] for r in ended] == ["consumed", "withdrawn"], ended

    retry = await api.call(api.agent(agent), "vm_shutdown", args, approval=token)
    assert outcome(retry) == "denied" and "withdrawn while request" in text(retry), retry
    assert sim_shutdowns(sim, args["timeout"]) == []  # nothing ran
