"""A pool membership change was decided on the cluster alone, not on the guests it moves.

pool_members_add and pool_members_remove named only the cluster in their target, so the guests they
move were never facts the policy saw: a deny scoped to pool prod (or to a protected guest's tags) never
held on them. A principal fenced off pool prod, with an unscoped grant of pool_* beside it, was only
asked for an approval to move prod's database guest into lab (`allow_move`), out of every binding that
fenced it. The guests a change moves are now target.members, each as the cluster knows it: a binding's
scope must cover each, and a deny covering one holds. Real simulator, real OPA, the gateway over HTTPS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.approvals.conftest import Api, outcome, text
from tests.e2e.fenced import fenced_gateway
from tests.support import mutations


def fenced(data: dict[str, Any]) -> None:
    """s50-pools: may change any pool and read everything, but nothing in pool prod."""
    data["roles"]["s50-fence"] = {"description": "fenced off", "deny": [{"tools": ["*"]}]}
    data["roles"]["s50-pools"] = {"description": "pools", "allow": [{"tools": ["pool_*"]}, {"effects": ["read"]}]}
    data["bindings"] += [
        {"name": "s50-pools", "role": "s50-pools", "subjects": ["s50-pools"]},
        {"name": "s50-no-prod", "role": "s50-fence", "subjects": ["s50-pools"], "scope": {"pools": ["prod"]}},
    ]


@pytest.fixture
def gw(fsim: Any, tmp_path: Path) -> Iterator[Api]:
    with fenced_gateway(fsim, tmp_path, fenced) as api:
        yield api


async def test_moving_a_prod_guest_out_of_its_pool_meets_the_prod_deny(gw: Api, fsim: Any) -> None:
    who = gw.human("s50-pools")
    moved = await gw.call(who, "pool_members_add", {"poolid": "lab", "vmids": "103,101", "allow_move": True})
    assert outcome(moved) == "denied", text(moved)
    assert "s50-no-prod" in text(moved), text(moved)
    removed = await gw.call(who, "pool_members_remove", {"poolid": "prod", "vmids": "101"})
    assert outcome(removed) == "denied", text(removed)
    assert not [m for m in mutations(fsim) if m[1].startswith("/pools")]
    # a lab guest only: the deny does not hold, decided as before (the example policy's approval or allow)
    lab = await gw.call(who, "pool_members_remove", {"poolid": "lab", "vmids": "103"})
    assert outcome(lab) != "denied", text(lab)
