"""A volume whose guest the gateway's token cannot see was taken for an orphan's.

target.volume_of said `exists: false` (an orphan: in no pool, no tags) for any guest /cluster/resources
did not list. Proxmox lists a guest there only with VM.Audit on it, and deletes a disk by its volume id
with Datastore.Allocate on the storage alone (pve-storage Content.pm delete): a token with a NoAccess
ACL on a guest (or on its pool) still deletes that guest's disks. So a protected guest hidden from the
token lost its disk to a storage_volume_delete decided as an orphan's (no guest_disk, no protected-tag
denial, no pool-scoped deny), its backups could be unprotected, and a prune deleted them (its
target.prune_removes took the hidden guest for a gone one, without tags). An owner not listed is now asked
for by id where no ACL hides it (GET /cluster/nextid?vmid=: PVE answers from the cluster's whole
guest list): an id in use, or an answer that cannot be read, is an owner not known, refused.
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

from gateway.core.config import load
from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import Api, outcome, text
from tests.support import GatewayThread, example_policy, free_port, mutations

ALWAYS = [
    {"name": "always", "weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "from_hour": 0, "to_hour": 24}
]


def scenario(path: Path) -> Path:
    """The small scenario, plus a token that may do everything but see db01 (101, tagged protected, in
    pool prod: a pool's ACL reaches its guests too, so both say NoAccess)."""
    data = yaml.safe_load((REPO_ROOT / "gateway" / "sim" / "scenarios" / "small.yaml").read_text())
    data["backups"].append({"storage": "pbs", "vmid": 101, "age_hours": 50, "size_mb": 5120})  # two of db01
    data["users"].append({"userid": "gwhide@pve", "acls": [{"path": "/", "roles": ["Administrator"]}]})
    acls = [{"path": "/", "roles": ["Administrator"]}, {"path": "/vms/101", "roles": ["NoAccess"]}]
    acls.append({"path": "/pool/prod", "roles": ["NoAccess"]})
    data["tokens"].append({"name": "hide", "tokenid": "gwhide@pve!hide", "privsep": True, "acls": acls})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def hsim(tmp_path: Path) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator(str(scenario(tmp_path / "scenario.yaml")), tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()


@pytest.fixture
def api(hsim: Any, tmp_path: Path) -> Iterator[Api]:
    def edit(data: dict[str, Any]) -> None:
        data["guardrails"]["maintenance_windows"] = ALWAYS

    opa = example_policy(tmp_path / "policy", edit)
    env = make_env(tmp_path / "gw", {"default": hsim}, port=free_port(), opa=opa)
    (env.workdir / "secrets" / "default-pve-token").write_text(hsim.tokens["hide"] + "\n")
    env.config = load(env.config_path)
    gw = GatewayThread(env.config).start()
    try:
        yield Api(env)
    finally:
        gw.stop()


async def pve_post(sim: Any, path: str, data: dict[str, str]) -> None:
    """A call made in Proxmox itself with the simulator's admin token, not through the gateway."""
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(sim.ca_file))) as http:
        r = await http.post(
            f"{sim.api_url}{path}", data=data, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}
        )
    assert r.status_code == 200, r.text


async def test_a_hidden_guests_volumes_are_no_orphans(api: Api, hsim: Any) -> None:
    admin = api.human("s50-vol-admin", ["pve-admins"])
    listed = await api.call(admin, "list_guests", {})
    assert 101 not in {g.get("vmid") for g in listed["structuredContent"]["items"]}, text(listed)  # hidden

    disk = "local-lvm:vm-101-disk-0"
    hsim.clear_logs()
    res = await api.call(admin, "storage_volume_delete", {"node": "pve1", "storage": "local-lvm", "volume": disk})
    assert outcome(res) == "denied", text(res)  # was: pending_approval, as an orphan's
    assert "guardrail.volume_owner_unknown" in res["structuredContent"]["codes"], text(res)
    assert "approval" not in res["structuredContent"]
    assert mutations(hsim) == []

    # nor is its backup unprotected
    backup = next(v for v in hsim.state()["volumes"] if "/vm/101/" in v)
    args = {"node": "pve1", "storage": "pbs", "volume": backup, "protected": False}
    res = await api.call(admin, "storage_volume_set", args)
    assert outcome(res) == "denied", text(res)
    assert "guardrail.volume_owner_unknown" in res["structuredContent"]["codes"], text(res)
    assert mutations(hsim) == []
    assert disk in hsim.state()["volumes"]


async def test_a_prune_never_reaches_a_hidden_guests_backups(api: Api, hsim: Any) -> None:
    """Proxmox's preview marks db01's older backup for removal; db01 is tagged protected but not listed."""
    admin = api.human("s50-vol-admin", ["pve-admins"])
    before = [v for v in hsim.state()["volumes"] if "/vm/101/" in v]
    assert len(before) == 2
    for args in ({}, {"vmid": 101}):
        hsim.clear_logs()
        res = await api.call(admin, "backup_prune", {"node": "pve1", "storage": "pbs", "keep": "keep-last=1", **args})
        assert outcome(res) == "denied", text(res)  # was: pending_approval, then the backup pruned
        assert "guardrail.prune_unknown" in res["structuredContent"]["codes"], text(res)
        assert mutations(hsim) == []
    assert [v for v in hsim.state()["volumes"] if "/vm/101/" in v] == before


async def test_a_real_orphan_is_still_one(api: Api, hsim: Any) -> None:
    """A disk whose guest is gone from the whole cluster: still an orphan, deleted after approval."""
    disk = {"vmid": "777", "filename": "vm-777-disk-0", "size": "1G"}
    await pve_post(hsim, "/nodes/pve1/storage/local-lvm/content", disk)
    admin = api.human("s50-vol-admin", ["pve-admins"])
    args = {"node": "pve1", "storage": "local-lvm", "volume": "local-lvm:vm-777-disk-0"}
    res = await api.call(admin, "storage_volume_delete", args)
    assert outcome(res) == "pending_approval", text(res)
    vote = await api.vote(res["structuredContent"]["approval"]["id"], api.human("s50-vol-alice", ["sre-leads"]))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    res = await api.call(admin, "storage_volume_delete", args, approval=vote.json()["token"])
    assert not res.get("isError"), text(res)
    assert "local-lvm:vm-777-disk-0" not in hsim.state()["volumes"]
