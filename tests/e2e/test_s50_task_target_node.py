"""task_stop's target named no node: its path's node is the one its UPID names (the runtime
locates it there), but the resolver only read a `target.node` parameter, which the tool has not.
The policy saw a call on no node, so a deny scoped to nodes never held on it: a principal fenced
off node pve1 by a deny, with an unscoped grant of task_stop beside it, was only asked for an
approval to stop a running task on pve1 (a backup, a migration) and, approved, stopped it. Now
the target's node is the UPID's: the deny holds there, and a task on another node is decided as
before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.approvals.conftest import Api, outcome, text
from tests.e2e.fenced import fenced_gateway
from tests.support import mutations


def fenced(data: dict[str, Any]) -> None:
    """s50-tasks: may stop any task and read everything, but nothing on node pve1."""
    data["roles"]["s50-fence"] = {"description": "fenced off", "deny": [{"tools": ["*"]}]}
    data["roles"]["s50-tasks"] = {"description": "tasks", "allow": [{"tools": ["task_stop"]}, {"effects": ["read"]}]}
    data["bindings"] += [
        {"name": "s50-tasks", "role": "s50-tasks", "subjects": ["s50-tasks"]},
        {"name": "s50-no-pve1", "role": "s50-fence", "subjects": ["s50-tasks"], "scope": {"nodes": ["pve1"]}},
    ]


@pytest.fixture
def gw(fsim: Any, tmp_path: Path) -> Iterator[Api]:
    with fenced_gateway(fsim, tmp_path, fenced) as api:
        yield api


def upid(node: str) -> str:
    """A backup task of a guest on that node (101 on pve1, 103 on pve2): the task's guest is decided on too."""
    return f"UPID:{node}:00001234:00005678:6500AAAA:vzdump:{101 if node == 'pve1' else 103}:root@pam:"


async def test_a_node_deny_holds_on_a_task_of_that_node(gw: Api, fsim: Any) -> None:
    who = gw.human("s50-tasks")
    stop = await gw.call(who, "task_stop", {"upid": upid("pve1")})
    assert outcome(stop) == "denied", text(stop)
    assert "s50-no-pve1" in text(stop), text(stop)
    # a read of a pve1 task's log through the composite: the UPID's node is the target's too
    tail = await gw.call(who, "task_log_tail", {"upid": upid("pve1")})
    assert outcome(tail) == "denied" and "s50-no-pve1" in text(tail), text(tail)
    assert not [m for m in mutations(fsim) if "/tasks/" in m[1]]
    # a task on another node: the deny does not hold there, decided as before (held for an approval)
    other = await gw.call(who, "task_stop", {"upid": upid("pve2")})
    assert outcome(other) == "pending_approval", text(other)
