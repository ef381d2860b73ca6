"""A backup job's retention pruned a protected guest's backups, and no check saw it.

A backup job's retention is a prune that runs unattended after every run: vzdump deletes each of the
job's guests' backups on its storage that the job's `prune-backups` does not keep, or the storage's
own retention when the job sets none. The guard rail "a protected guest's backups are never pruned"
and every scoped deny held on `backup_prune` (its target.prune_removes), but not on the job tools:
- `backup_job_retention_set` named only the cluster: a retention set on a job backing up a protected
  guest (pool prod, db01) was only held for an approval, and then deleted that guest's backups;
- `backup_job_create` without `keep_all` sent no retention, so the storage's applied: a write-class
  call made a job that prunes;
- `backup_job_update` pointing a job that prunes at other guests (or another storage) made it prune
  theirs, a protected guest's too.
Now the job is read when the call is decided: a retention that deletes backups, or a pruning job
pointed elsewhere, has target.prune_removes (the guests it then prunes, as the cluster knows them
now), and the policy's prune checks hold on it; a job the gateway creates keeps every backup.
Real simulator, real OPA, the gateway over HTTPS.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import Api, outcome, text
from tests.support import GatewayThread, example_policy, free_port, mutations

ALWAYS = [
    {"name": "always", "weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "from_hour": 0, "to_hour": 24}
]


def scenario(path: Path) -> Path:
    """The small scenario, with a storage whose own retention prunes (`pruning`) and two jobs made in
    Proxmox, not through the gateway: one with a retention of its own, one without on `pruning`."""
    data = yaml.safe_load((REPO_ROOT / "gateway" / "sim" / "scenarios" / "small.yaml").read_text())
    data["storages"].append(
        {"id": "pruning", "type": "dir", "content": ["backup"], "path": "/mnt/pruning", "total_gb": 100,
         "used_gb": 1, "shared": True, "extra": {"prune-backups": "keep-last=2"}}
    )  # fmt: skip
    data["backup_jobs"] += [
        {"id": "lab-own-retention", "type": "vzdump", "enabled": 1, "schedule": "03:00", "storage": "local",
         "vmid": "103", "mode": "snapshot", "prune-backups": "keep-last=1"},
        {"id": "lab-storage-retention", "type": "vzdump", "enabled": 1, "schedule": "04:00", "storage": "pruning",
         "vmid": "103", "mode": "snapshot"},
    ]  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def psim(tmp_path: Path) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator(str(scenario(tmp_path / "scenario.yaml")), tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()


@pytest.fixture
def api(psim: Any, tmp_path: Path) -> Iterator[Api]:
    def edit(data: dict[str, Any]) -> None:
        data["guardrails"]["maintenance_windows"] = ALWAYS  # destroy-class calls are held, not out of hours

    opa = example_policy(tmp_path / "policy", edit)
    env = make_env(tmp_path / "gw", {"default": psim}, port=free_port(), opa=opa)
    gw = GatewayThread(env.config).start()
    try:
        yield Api(env)
    finally:
        gw.stop()


def admin(api: Api) -> str:
    return api.human("s51-backup-admin", ["pve-admins"])


def codes(res: dict[str, Any]) -> list[str]:
    return list((res.get("structuredContent") or {}).get("codes") or [])


def job(sim: Any, jid: str) -> dict[str, Any]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(sim.ca_file))) as http:
        r = http.get(
            f"{sim.api_url}/cluster/backup/{jid}", headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}
        )
    assert r.status_code == 200, r.text[:300]
    got: dict[str, Any] = r.json()["data"]
    return got


async def test_a_retention_on_a_job_backing_up_a_protected_guest_is_refused(api: Api, psim: Any) -> None:
    # backup-prod-nightly backs up pool prod: web01 (100), db01 (101, tagged protected), dns01 (201)
    res = await api.call(admin(api), "backup_job_retention_set", {"id": "backup-prod-nightly", "keep": "keep-last=1"})
    assert outcome(res) == "denied" and "guardrail.protected_tag" in codes(res), res
    assert "guest 101" in text(res) and "protected" in text(res), text(res)
    # keeping every backup prunes nothing: only the destroy-class tool's approval is asked
    kept = await api.call(admin(api), "backup_job_retention_set", {"id": "backup-prod-nightly", "keep": "keep-all=1"})
    assert outcome(kept) == "pending_approval", kept
    # a job of unprotected guests (102, 103) may get one, with an approval as before
    lab = await api.call(admin(api), "backup_job_retention_set", {"id": "backup-lab-weekly", "keep": "keep-last=1"})
    assert outcome(lab) == "pending_approval", lab
    assert mutations(psim) == []
    assert job(psim, "backup-prod-nightly")["prune-backups"] == {"keep-daily": 7, "keep-weekly": 4}  # decoded, as PVE


async def test_a_new_job_keeps_every_backup_whatever_its_storage_prunes(api: Api, psim: Any) -> None:
    args = {"id": "s51_new", "schedule": "05:00", "storage": "pruning", "vmids": "103"}
    res = await api.call(admin(api), "backup_job_create", args)
    if outcome(res) == "pending_approval":  # the example policy holds it (a stop-capable job): approve it
        aid = str(res["structuredContent"]["approval"]["id"])
        for voter in ("s51-alice", "s51-bob"):
            vote = await api.vote(aid, api.human(voter, ["sre-leads"]))
            assert vote.status_code == 200, vote.text
            if vote.json()["state"] == "approved":
                break
        res = await api.call(admin(api), "backup_job_create", args, approval=str(vote.json()["token"]))
    assert outcome(res) == "allowed", res
    assert job(psim, "s51_new")["prune-backups"] == {"keep-all": 1}


async def test_a_pruning_job_pointed_at_a_protected_guest_is_refused(api: Api, psim: Any) -> None:
    for jid in ("lab-own-retention", "lab-storage-retention"):  # the job's retention, or its storage's
        res = await api.call(admin(api), "backup_job_update", {"id": jid, "vmids": "103,101"})
        assert outcome(res) == "denied" and "guardrail.protected_tag" in codes(res), (jid, res)
        res = await api.call(admin(api), "backup_job_update", {"id": jid, "pool": "prod"})
        assert outcome(res) == "denied" and "guardrail.protected_tag" in codes(res), (jid, res)
    # another storage that prunes, for a job whose retention is the storage's
    res = await api.call(admin(api), "backup_job_update", {"id": "backup-lab-weekly", "storage": "pruning"})
    assert outcome(res) == "allowed" or "guardrail.protected_tag" not in codes(res), res  # 102, 103: unprotected
    assert all(path.endswith("/backup-lab-weekly") for _, path in mutations(psim)), mutations(psim)
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-storage-retention", "vmids": "101"})
    assert "guardrail.protected_tag" in codes(res), res
    assert job(psim, "lab-storage-retention")["vmid"] == "103" and job(psim, "lab-own-retention")["vmid"] == "103"


async def test_a_job_that_keeps_every_backup_may_take_a_protected_guest(api: Api, psim: Any) -> None:
    # storage local keeps every backup (no retention of its own): the job prunes nothing
    res = await api.call(admin(api), "backup_job_update", {"id": "backup-lab-weekly", "vmids": "102,103,101"})
    assert "guardrail.protected_tag" not in codes(res), res
    # a pruning job told to keep every backup from now on
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-own-retention", "vmids": "101", "keep_all": True})
    assert "guardrail.protected_tag" not in codes(res), res
    # the schedule of a pruning job: the same guests' backups on the same storage
    res = await api.call(admin(api), "backup_job_update", {"id": "backup-prod-nightly", "schedule": "01:00"})
    assert "guardrail.protected_tag" not in codes(res) and "guardrail.prune_unknown" not in codes(res), res


async def test_a_job_that_cannot_be_read_is_not_taken_for_one_that_prunes_nothing(api: Api, psim: Any) -> None:
    res = await api.call(admin(api), "backup_job_retention_set", {"id": "no_such_job", "keep": "keep-last=1"})
    assert outcome(res) == "denied" and "guardrail.prune_unknown" in codes(res), res
    psim.set_faults(error_rate=1.0, error_path="^/storage/")
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-storage-retention", "vmids": "102"})
    assert outcome(res) == "denied" and "guardrail.prune_unknown" in codes(res), res
    psim.set_faults()
    assert mutations(psim) == []


async def test_a_disabled_pruning_job_enabled_again_is_checked(api: Api, psim: Any) -> None:
    """Review: enabling a job again made it prune again, unchecked (no guests, no storage given)."""
    with httpx.Client(verify=ssl.create_default_context(cafile=str(psim.ca_file))) as http:
        r = http.put(
            f"{psim.api_url}/cluster/backup/backup-prod-nightly",
            data={"enabled": "0"},
            headers={"Authorization": f"PVEAPIToken={psim.tokens['admin']}"},
        )  # disabled in Proxmox itself
    assert r.status_code == 200, r.text[:300]
    res = await api.call(admin(api), "backup_job_update", {"id": "backup-prod-nightly", "enabled": True})
    assert outcome(res) == "denied" and "guardrail.protected_tag" in codes(res), res  # db01 (101) again
    args = {"id": "backup-prod-nightly", "enabled": True, "keep_all": True}
    kept = await api.call(admin(api), "backup_job_update", args)
    assert "guardrail.protected_tag" not in codes(kept), kept
    # a job that runs already: enabling it changes nothing it prunes
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-own-retention", "enabled": True})
    assert "guardrail.protected_tag" not in codes(res) and "guardrail.prune_unknown" not in codes(res), res
