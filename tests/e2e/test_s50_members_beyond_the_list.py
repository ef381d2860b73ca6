"""Calls that reach guests beyond a member list: a pool's, every guest, a saved job's, an ACL path, a task.

After target.members named the guests a member list picks, four ways around it were left (found by
the hunt that fixed the lists): a backup job selecting a pool or `all` (a stop-mode job then stops
prod's guests every night), a job or HA rule updated without its list (its saved selection stays),
an ACL set on `/vms/101` or `/pool/prod` (a Proxmox user gets rights on prod's guests outside the
gateway), and task_stop on a prod guest's task (the UPID's id field names it). A principal fenced
off pool prod, with an unscoped grant beside it, was only asked for an approval for each. Now the
guest a path or a UPID names is a member, and a selection the gateway does not list (a pool, all,
a saved one, any other ACL path) makes the members not known: every scoped deny holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.tools.targets import member_ids
from tests.approvals.conftest import outcome, text
from tests.e2e.fenced import fenced_gateway
from tests.e2e.test_s50_member_lists_reach import fenced
from tests.support import mutations

APT = "UPID:pve1:00001234:00005678:6500AAAA:aptupdate::root@pam:"


def upid(kind: str, vmid: int, node: str = "pve1") -> str:
    return f"UPID:{node}:00001234:00005678:6500AAAA:{kind}:{vmid}:root@pam:"


def test_a_guests_acl_path_and_task_name_it() -> None:
    assert member_ids("/vms/101") == [101]
    assert member_ids(upid("qmstart", 101)) == [101]
    assert member_ids(APT) == []  # a node's task: no guest
    for no_guest in ("/storage/local", "/nodes/pve1", "/access/groups", "/sdn/zones/z1", "/mapping/pci/gpu"):
        assert member_ids(no_guest) == [], no_guest
    for other in ("/", "/pool/prod", "/vms"):
        try:
            member_ids(other)
        except ValueError:
            continue
        raise AssertionError(f"{other} read as guests")


async def test_selections_beyond_the_list_meet_the_prod_deny(fsim: Any, tmp_path: Path) -> None:
    with fenced_gateway(fsim, tmp_path, fenced) as gw:
        who = gw.human("s50-all")
        job = {"id": "nightly", "schedule": "02:00", "storage": "local", "mode": "stop"}
        acl = {"roles": "PVEVMAdmin", "users": "mallory@pve"}
        for name, args in [
            ("backup_job_create", {**job, "all": True}),
            ("backup_job_create", {**job, "pool": "lab"}),
            ("backup_job_update", {"id": "backup-prod-nightly", "mode": "stop"}),
            ("acl_set", {**acl, "path": "/vms/101"}),
            ("acl_set", {**acl, "path": "/pool/lab"}),
            ("acl_remove", {**acl, "path": "/"}),
            ("task_stop", {"upid": upid("qmstart", 101)}),
            # no guest 999 yet: Proxmox takes the id, and the guest made later may be prod's
            ("backup_job_create", {**job, "vmids": "103,999"}),
            ("acl_set", {**acl, "path": "/vms/999"}),
            # into prod: the pool the guests go into is reached too
            ("pool_members_add", {"poolid": "prod", "vmids": "103", "allow_move": True}),
        ]:
            res = await gw.call(who, name, args)
            assert outcome(res) == "denied", (name, args, text(res))
            assert "s50-no-prod" in text(res), (name, text(res))
        assert not mutations(fsim)
        # what names lab guests or no guest only: the deny does not hold, decided as before
        for name, args in [
            ("backup_job_create", {**job, "vmids": "103"}),
            ("backup_job_update", {"id": "backup-prod-nightly", "vmids": "103"}),
            ("acl_set", {**acl, "path": "/vms/103"}),
            ("task_stop", {"upid": upid("qmstart", 103, "pve2")}),
            ("task_stop", {"upid": APT}),
            ("acl_set", {**acl, "path": "/storage/local"}),  # a storage's ACL reaches no guest
        ]:
            res = await gw.call(who, name, args)
            assert outcome(res) != "denied", (name, args, text(res))


async def test_a_node_reboot_reaches_every_guest_on_it(fsim: Any, tmp_path: Path) -> None:
    """node_reboot and node_shutdown stop every guest on the node: a deny scoped to pool prod holds on
    a node hosting prod's guests (pve1: 100, 101), not on one hosting none (pve3: 300, in no pool)."""
    with fenced_gateway(fsim, tmp_path, fenced) as gw:
        who = gw.human("s50-all")
        for name in ("node_reboot", "node_shutdown"):
            res = await gw.call(who, name, {"node": "pve1"})
            assert outcome(res) == "denied", (name, text(res))
            assert "s50-no-prod" in text(res), (name, text(res))
        assert not mutations(fsim)
        other = await gw.call(who, "node_reboot", {"node": "pve3"})
        assert outcome(other) != "denied", text(other)


def test_an_ha_rule_moves_its_guests_to_nodes_the_ha_manager_picks() -> None:
    """A node-affinity rule moves its guests onto its nodes: the destination node is not known, so a
    node-scoped deny holds (as for an HA group, ha_resource_group_set)."""
    from gateway.tools.catalog import Catalog

    catalog = Catalog.load(Path(__file__).resolve().parents[2] / "connectors")
    for name in ("ha_rule_create", "ha_rule_update", "ha_resource_group_set"):
        assert catalog.get(name).destination == {"node": None}, name
    assert catalog.get("pool_members_add").destination == {"pool": "poolid"}
