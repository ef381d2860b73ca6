"""A policy rollout applies to approvals held or granted under the policy before it (found in review).

- A call held under one policy and made again under a new one that names other approver groups
  (or another minimum, or lifetime) used to get the old pending request back: the approvers the
  new policy names could not vote on it, and an approval the old groups gave was refused as not
  enough. Now the old request is superseded (expired, `decided_by` "policy change", audited) and
  a new one asks what the new policy asks.
- A lifetime the new policy shortens used to leave approvals granted before it valid for the old
  one (the token's expiry is the stored ttl). Now the policy refuses an approval whose `approved_at`
  plus the lifetime it asks now is past (approval.not_for_this_call).

The real gateway (restarted on the changed policy data), its managed OPA and a simulator of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.approvals.conftest import Api, approvals_env, outcome, text, write_policy_data
from tests.approvals.test_flow import sim_shutdowns
from tests.support import GatewayThread, audit_rows

pytestmark = pytest.mark.asyncio

RULE = "test-prod-shutdown"  # vm_shutdown of a prod guest: sre-leads (conftest.APPROVAL_RULES)


class Rollout:
    """One simulator and gateway state; the policy data changed between gateway runs."""

    def __init__(self, tmp_path: Path) -> None:
        from gateway.sim.harness import start_simulator

        self.sim = start_simulator("small", tmp_path / "sim", ssh=False)
        self.policy = write_policy_data(tmp_path / "pol")
        self.env = approvals_env(self.sim, self.policy, tmp_path / "gw")
        self.api = Api(self.env)
        self.gw: GatewayThread | None = None

    def run(self, change: Callable[[dict[str, Any]], None] | None = None) -> Api:
        """(Re)start the gateway, first changing the shutdown rule with `change`."""
        self.stop_gateway()
        if change is not None:
            f = self.policy / "data" / "data.yaml"
            data = yaml.safe_load(f.read_text())
            change(next(r for r in data["approval"]["rules"] if r["name"] == RULE))
            f.write_text(yaml.safe_dump(data, sort_keys=False))
        self.gw = GatewayThread(self.env.config).start()
        return self.api

    def stop_gateway(self) -> None:
        if self.gw is not None:
            self.gw.stop()
            self.gw = None


@pytest.fixture
def rollout(tmp_path: Path) -> Iterator[Rollout]:
    r = Rollout(tmp_path)
    try:
        yield r
    finally:
        r.stop_gateway()
        r.sim.stop()


async def _held(api: Api, args: dict[str, Any]) -> dict[str, Any]:
    res = await api.call(api.agent(), "vm_shutdown", args)
    assert outcome(res) == "pending_approval", res
    approval: dict[str, Any] = res["structuredContent"]["approval"]
    return approval


async def _state(api: Api, aid: str) -> dict[str, Any]:
    r = await api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


async def test_a_request_pending_under_an_older_policy_is_superseded(rollout: Rollout) -> None:
    args = {"vmid": 100, "timeout": 55}
    api = rollout.run()
    old = await _held(api, args)
    assert old["approver_groups"] == ["sre-leads"]
    again = await _held(api, args)  # the same policy: the same request
    assert again["id"] == old["id"]

    api = rollout.run(lambda rule: rule.update(approver_groups=["ops-approvers"]))  # the rollout
    held = await api.call(api.agent(), "vm_shutdown", args)
    new = held["structuredContent"]["approval"]
    assert new["id"] != old["id"] and new["approver_groups"] == ["ops-approvers"], new
    gone = await _state(api, old["id"])
    assert gone["state"] == "expired" and gone["decided_by"] == "policy change", gone
    assert f"superseded by {new['id']}" in gone["note"] and "ops-approvers" in gone["note"], gone
    rows = audit_rows(rollout.env.config.audit_path, held["_meta"]["pvegate/request_id"])
    superseded = [r for r in rows if r["kind"] == "approval" and r["outcome"] == "superseded"]
    assert len(superseded) == 1 and old["id"] in superseded[0]["body"] and new["id"] in superseded[0]["body"]

    late = await api.vote(old["id"], api.human("alice", ["sre-leads"]))  # the old groups can no longer vote
    assert late.status_code != 200 and "token" not in late.json(), late.text
    vote = await api.vote(new["id"], api.human("bob", ["ops-approvers"]))  # who the new policy names can
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    done = await api.call(api.agent(), "vm_shutdown", args, approval=vote.json()["token"])
    assert outcome(done) in ("allowed", "failed"), done
    assert len(sim_shutdowns(rollout.sim, args["timeout"])) == 1

    # and the same under the rollout's policy again: the live request is reused, nothing superseded
    args2 = {"vmid": 100, "timeout": 56}
    first = await _held(api, args2)
    assert (await _held(api, args2))["id"] == first["id"]


async def test_a_lifetime_shortened_by_a_rollout_applies_to_an_approval_granted_before(rollout: Rollout) -> None:
    args = {"vmid": 100, "timeout": 66}
    api = rollout.run(lambda rule: rule.update(ttl_seconds=3600))
    held = await _held(api, args)
    vote = await api.vote(held["id"], api.human("alice", ["sre-leads"]))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    token = vote.json()["token"]  # valid for an hour under this policy

    api = rollout.run(lambda rule: rule.update(ttl_seconds=2))  # the rollout: approvals last 2 s
    await asyncio.sleep(3)
    refused = await api.call(api.agent(), "vm_shutdown", args, approval=token)
    assert outcome(refused) == "denied", refused
    assert "approval.not_for_this_call" in refused["structuredContent"]["codes"], refused
    assert "longer ago than the 2 s an approval of this call lasts now" in text(refused), text(refused)
    assert sim_shutdowns(rollout.sim, args["timeout"]) == []
