"""An approval stays bound to the guest's pool and tags it was granted on (store/approvals.target_key).

What was wrong: the token was bound to the target's cluster, node, vmid and storage only. An
approver's binding may be scoped to pools or guest tags (rbac.may_approve, asked at the vote), and
an approval rule may select guests by tag; yet a guest moved into another pool (or retagged) after
the vote still redeemed the token, and the final decision checks only how many approvers and which
groups, not whether they may approve on the guest as it is now. So an approver scoped to pool `lab`
approved a shutdown of a lab guest, the guest was moved into `prod`, and the agent shut down a prod
guest on the strength of an approval nobody entitled to approve on prod had given.

Now pool and tags are part of the target key: the retry no longer matches, the token is refused
(not spent), and the call needs an approval on the guest as it is now.

The real gateway, its managed OPA with the policy library and a simulator of its own.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.store.approvals import target_key
from tests.approvals.conftest import Api, approvals_env, outcome, text, write_policy_data
from tests.approvals.test_flow import sim_shutdowns
from tests.support import GatewayThread

VMID = 103  # small scenario: pve2, pool lab, tags [dev]


def _lab_scoped_policy(root: Path) -> Path:
    """A dev guest's shutdown needs a lab approver; lab approvers may approve on pool lab only."""
    write_policy_data(root)
    f = root / "data" / "data.yaml"
    data = yaml.safe_load(f.read_text())
    data["approval"]["rules"].append(
        {
            "name": "test-dev-shutdown",
            "tools": ["vm_shutdown"],
            "target_tags": ["dev"],
            "reason": "shutting down a dev guest needs a lab approver",
            "approver_groups": ["lab-approvers"],
        }
    )
    data["bindings"].append(
        {"name": "lab-approvers", "role": "approver", "groups": ["lab-approvers"], "scope": {"pools": ["lab"]}}
    )
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def psim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("s50sim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def papi(psim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    policy = _lab_scoped_policy(tmp_path_factory.mktemp("s50pol"))
    env = approvals_env(psim, policy, tmp_path_factory.mktemp("s50gw"))
    gw = GatewayThread(env.config).start()
    try:
        yield Api(env)
    finally:
        gw.stop()


def _move_to_pool(sim: Any, vmid: int, pool: str) -> None:
    """What an administrator (or another tool) does in Proxmox meanwhile."""
    ctx = ssl.create_default_context(cafile=str(sim.ca_file))
    headers = {"Authorization": "PVEAPIToken=" + sim.tokens["admin"]}
    with httpx.Client(base_url=sim.api_url.rstrip("/"), headers=headers, verify=ctx, timeout=10) as http:
        r = http.put("/pools", data={"poolid": pool, "vms": str(vmid), "allow-move": "1"})
        assert r.status_code == 200, r.text
        guests = http.get("/cluster/resources", params={"type": "vm"}).json()["data"]
    assert next(g for g in guests if g["vmid"] == vmid)["pool"] == pool


async def test_an_approval_given_on_a_lab_guest_does_not_run_once_it_is_in_prod(papi: Api, psim: Any) -> None:
    agent, carol = papi.agent(), papi.human("carol", ["lab-approvers"])
    args = {"vmid": VMID, "timeout": 47}
    held = await papi.call(agent, "vm_shutdown", args)
    assert outcome(held) == "pending_approval", held
    aid = held["structuredContent"]["approval"]["id"]
    vote = await papi.vote(aid, carol)
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    token = vote.json()["token"]

    _move_to_pool(psim, VMID, "prod")
    try:
        # the scope works at the vote: carol may not approve this call on the guest as it is now
        now_held = await papi.call(agent, "vm_shutdown", {**args, "timeout": 48})
        assert outcome(now_held) == "pending_approval", now_held
        refused = await papi.vote(now_held["structuredContent"]["approval"]["id"], carol)
        assert refused.status_code == 403, refused.text

        # nor does the approval she gave on the lab guest run on the prod guest
        res = await papi.call(agent, "vm_shutdown", args, approval=token)
        assert outcome(res) != "allowed", res
        assert "another target" in text(res), res
        assert sim_shutdowns(psim, 47) == []
        state = (await papi.admin("GET", f"/admin/approvals/{aid}", papi.admin_token)).json()
        assert state["state"] == "approved", state  # refused before use: not spent
    finally:
        _move_to_pool(psim, VMID, "lab")

    # back in its pool: the approval is the call it was granted for again, and runs once
    done = await papi.call(agent, "vm_shutdown", args, approval=token)
    assert outcome(done) in ("allowed", "failed"), done
    assert len(sim_shutdowns(psim, 47)) == 1


def test_pool_and_tags_are_in_the_key_and_a_guest_without_them_keeps_its_old_key() -> None:
    guest = {"cluster": "default", "node": "pve2", "vmid": VMID, "storage": None}
    lab = target_key({**guest, "pool": "lab", "tags": ["dev", "web"]})
    assert target_key({**guest, "pool": "lab", "tags": ["web", "dev"]}) == lab  # tag order is no difference
    assert target_key({**guest, "pool": "prod", "tags": ["dev", "web"]}) != lab
    assert target_key({**guest, "pool": None, "tags": ["dev", "web"]}) != lab
    assert target_key({**guest, "pool": "lab", "tags": ["dev"]}) != lab
    assert target_key({**guest, "pool": "lab", "tags": ["dev", "web", "prod"]}) != lab
    # approvals pending across the upgrade on a guest in no pool and without tags stay valid
    bare = '{"cluster":"default","node":"pve2","storage":null,"vmid":103}'
    assert target_key({**guest, "pool": None, "tags": []}) == bare


def test_the_guest_whose_data_a_call_reaches_is_bound_by_pool_too() -> None:
    """A volume's, a backup's and a pruned guest's pool is what a scoped approver was checked against."""
    node = {"cluster": "default", "node": "pve1", "vmid": None, "storage": "local"}
    owner = {"vmid": 103, "node": "pve2", "pool": "lab", "tags": ["dev"]}
    moved = {**owner, "pool": "prod"}
    for field in ("volume_of", "backup_of"):
        assert target_key({**node, field: owner}) != target_key({**node, field: moved}), field
    pruned = {"known": True, "guests": [owner]}
    assert target_key({**node, "prune_removes": pruned}) != target_key(
        {**node, "prune_removes": {"known": True, "guests": [moved]}}
    )
