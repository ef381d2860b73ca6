"""HA rules, backup jobs and replication jobs were decided on the cluster alone, not on the guests they name.

ha_rule_create/ha_rule_update (`resources: vm:101,ct:201`), backup_job_create/backup_job_update
(`vmids: 101,102`) and replication_job_create/_update/_delete (`id: 101-0`, the guest's id first)
named only the cluster in their target, so the guests they pin to nodes, stop for a stop-mode
backup, or copy to another node were never facts the policy saw: a deny scoped to pool prod never
held on them. A principal fenced off pool prod, with an unscoped grant beside it, was only asked for
an approval to pin prod's database guest to a node, back it up in stop mode every night, or drop
its replica. Their member lists are now target.members, each guest as the cluster knows it: a
binding's scope must cover each, and a deny covering one holds. Real simulators, real OPA, the
gateway over HTTPS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.tools.targets import member_ids
from tests.approvals.conftest import outcome, text
from tests.e2e.fenced import fenced_gateway
from tests.support import mutations


def fenced(data: dict[str, Any]) -> None:
    """s50-all: may call every tool, but nothing in pool prod."""
    data["roles"]["s50-fence"] = {"description": "fenced off", "deny": [{"tools": ["*"]}]}
    data["roles"]["s50-all"] = {"description": "everything", "allow": [{"tools": ["*"]}]}
    data["bindings"] += [
        {"name": "s50-all", "role": "s50-all", "subjects": ["s50-all"]},
        {"name": "s50-no-prod", "role": "s50-fence", "subjects": ["s50-all"], "scope": {"pools": ["prod"]}},
    ]


@pytest.fixture
def pve9(tmp_path: Path) -> Iterator[Any]:
    """A PVE 9 simulator (HA rules): guests 100, 101, 200, 201 in pool prod, 102 and 202 in none."""
    from gateway.sim.harness import start_simulator

    handle = start_simulator("second", tmp_path / "sim9", ssh=False)
    yield handle
    handle.stop()


def test_member_lists_name_their_guests() -> None:
    assert member_ids("101,102,101") == [101, 102]
    assert member_ids("vm:101,ct:201") == [101, 201]
    assert member_ids("101-0") == [101]
    assert member_ids(None) == []
    for bad in ("vm:", "lxc:101", "101-", "x101", "101-0-1"):
        with pytest.raises(ValueError):
            member_ids(bad)


async def test_ha_rules_on_prod_guests_meet_the_prod_deny(pve9: Any, tmp_path: Path) -> None:
    with fenced_gateway(pve9, tmp_path, fenced) as gw:
        who = gw.human("s50-all")
        pin = {"rule": "pin", "type": "node-affinity", "resources": "vm:102,vm:101", "nodes": "edge3", "strict": True}
        created = await gw.call(who, "ha_rule_create", pin)
        assert outcome(created) == "denied", text(created)
        assert "s50-no-prod" in text(created), text(created)
        updated = await gw.call(who, "ha_rule_update", {**pin, "resources": "ct:201"})
        assert outcome(updated) == "denied", text(updated)
        assert not mutations(pve9)
        # guests in no pool: the deny does not hold, decided as before (the example policy's approval or allow)
        free = await gw.call(who, "ha_rule_create", {**pin, "resources": "vm:102,ct:202"})
        assert outcome(free) != "denied", text(free)


async def test_backup_and_replication_jobs_on_prod_guests_meet_the_prod_deny(fsim: Any, tmp_path: Path) -> None:
    with fenced_gateway(fsim, tmp_path, fenced) as gw:
        who = gw.human("s50-all")
        job = {"id": "nightly", "schedule": "02:00", "storage": "local", "vmids": "103,101", "mode": "stop"}
        for name, args in [
            ("backup_job_create", job),
            ("backup_job_update", {"id": "nightly", "vmids": "200"}),
            ("replication_job_create", {"id": "101-0", "target_node": "pve2"}),
            ("replication_job_update", {"id": "201-0", "disable": True}),
            ("replication_job_delete", {"id": "100-0"}),
        ]:
            res = await gw.call(who, name, args)
            assert outcome(res) == "denied", (name, text(res))
            assert "s50-no-prod" in text(res), (name, text(res))
        assert not mutations(fsim)
        # lab guests only: the deny does not hold
        for name, args in [("backup_job_create", {**job, "vmids": "103"}), ("replication_job_delete", {"id": "103-0"})]:
            res = await gw.call(who, name, args)
            assert outcome(res) != "denied", (name, text(res))
