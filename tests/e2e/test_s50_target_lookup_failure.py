"""A call's target facts when the inventory lookup (GET /cluster/resources) fails with an error
that is not an outage (a 500, a read timeout): the resolver dropped everything the call names and
handed the policy a target with no node, no vmid and a pool it called known (null: "no pool").
A binding's deny scoped to nodes, vmids or pools then held on nothing, so a principal fenced off
node pve1 (or pool prod) by a deny, with an unscoped grant beside it, refreshed pve1's package
lists or read pve1's certificates whenever Proxmox answered that one lookup with an error: the
deny (deny overrides allow) failed open exactly when the facts were least certain. Now the node
and vmid the call names stay the target's, and a guest's pool is not known (pool_known false), so
those denies hold; a grant scoped to a pool still does not cover an unresolved guest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.approvals.conftest import Api, outcome, text
from tests.e2e.fenced import fenced_gateway
from tests.support import mutations

RESOURCES = r"^/cluster/resources$"


def fenced(data: dict[str, Any]) -> None:
    """s50-ops: node upkeep and every read everywhere, but nothing on node pve1, guest 100-199 or pool prod."""
    data["roles"]["s50-fence"] = {"description": "fenced off", "deny": [{"tools": ["*"]}]}
    data["bindings"] += [
        {"name": "s50-upkeep", "role": "node-maintainer", "subjects": ["s50-ops"]},
        {"name": "s50-read", "role": "auditor", "subjects": ["s50-ops"]},
        {"name": "s50-no-pve1", "role": "s50-fence", "subjects": ["s50-ops"], "scope": {"nodes": ["pve1"]}},
        {"name": "s50-no-prod", "role": "s50-fence", "subjects": ["s50-ops"], "scope": {"pools": ["prod"]}},
    ]


@pytest.fixture
def gw(fsim: Any, tmp_path: Path) -> Iterator[Api]:
    with fenced_gateway(fsim, tmp_path, fenced) as api:
        yield api


@pytest.mark.parametrize("status", [500, 596])
async def test_a_failed_inventory_lookup_keeps_the_node_a_deny_fences(gw: Api, fsim: Any, status: int) -> None:
    ops = gw.human("s50-ops")
    fsim.set_faults(error_rate=1.0, error_status=status, error_path=RESOURCES)
    try:
        before = len(fsim.requests_log())
        read = await gw.call(ops, "node_certificates", {"node": "pve1"})
        assert outcome(read) == "denied", text(read)
        refresh = await gw.call(ops, "node_apt_refresh", {"node": "pve1"})
        assert outcome(refresh) == "denied", text(refresh)
        asked = [e["path"] for e in fsim.requests_log()[before:]]
        assert not any(p.startswith("/nodes/pve1") for p in asked), asked
        assert ("POST", "/nodes/pve1/apt/update") not in mutations(fsim)
        # the node outside the fence is still served on the node the call names
        other = await gw.call(ops, "node_certificates", {"node": "pve2"})
        assert outcome(other) == "allowed", text(other)
    finally:
        fsim.set_faults(error_rate=0.0, error_path=None)


async def test_a_failed_inventory_lookup_keeps_a_pool_deny_on_the_guest_named(gw: Api, fsim: Any) -> None:
    """ha_resource_get acts on the guest its sid names (no locating): guest 201 (pool prod, node pve2)
    is fenced by the pool deny whether or not its pool could be read."""
    ops = gw.human("s50-ops")
    fsim.set_faults(error_rate=1.0, error_status=500, error_path=RESOURCES)
    try:
        before = len(fsim.requests_log())
        read = await gw.call(ops, "ha_resource_get", {"sid": 201})
        assert outcome(read) == "denied", text(read)
        assert "s50-no-prod" in text(read), text(read)
        asked = [e["path"] for e in fsim.requests_log()[before:]]
        assert not any(p.startswith("/cluster/ha/resources") for p in asked), asked
    finally:
        fsim.set_faults(error_rate=0.0, error_path=None)
    # answered again: the deny holds on the guest's known pool, as before
    read = await gw.call(ops, "ha_resource_get", {"sid": 201})
    assert outcome(read) == "denied", text(read)
