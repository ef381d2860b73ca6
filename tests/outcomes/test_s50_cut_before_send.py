"""A drain's cut-off that reaches a call before it was sent refuses it unsent (found in review).

At the end of the grace period the drain cuts off every call in flight (Outcomes.cut). A call still
on its way to Proxmox then (reading its target, asking OPA) was stopped at the connector's door
(`Outcomes.run`: "nothing was sent") but recorded as if it had been cut off mid-task: an
`interrupted` result with `pending_reconcile: true`, a reply saying "It may or may not have reached
Proxmox", its quota slot kept and, above all, its one-time approval left spent: the retry the
shutdown asks for was refused "already used" though nothing ever ran, and reconciliation had to go
looking in Proxmox for a task known never to have been asked for. Now it is closed as refused and
unsent (`sent: false`), its approval given back, and its client told nothing was sent.

The real gateway (its managed OPA, the approvals store), a simulator of its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.approvals.conftest import Api, outcome, text
from tests.approvals.test_flow import sim_shutdowns
from tests.approvals.test_spent_only_when_sent import _approved, _released, _state, quota_gateway
from tests.support import GatewayThread, audit_rows

pytestmark = pytest.mark.asyncio


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Any, GatewayThread, Api]]:
    with quota_gateway(tmp_path) as g:
        yield g


async def test_a_call_cut_off_before_it_was_sent_is_refused_unsent_and_gives_its_approval_back(
    gateway: Any,
) -> None:
    sim, gw, api = gateway
    args = {"vmid": 100, "timeout": 61}
    aid, token = await _approved(api, "demo-agent", args)
    outcomes = gw.components.outcomes
    outcomes.grace_seconds = 0.5
    # the approved call's target read (a mutation reads it fresh) takes longer than the grace period
    sim.set_faults(latency_ms=2500, latency_path="^/cluster/resources")
    retry = asyncio.create_task(api.call(api.agent(), "vm_shutdown", args, approval=token))
    deadline = time.monotonic() + 10
    while not outcomes.flights:  # in flight: past the door, reading its target
        assert time.monotonic() < deadline and not retry.done(), "the call never started"
        await asyncio.sleep(0.02)
    assert gw.loop is not None
    drained = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(outcomes.drain(), gw.loop))  # SIGTERM's drain
    result = await retry
    await drained

    assert sim_shutdowns(sim, args["timeout"]) == []  # nothing reached Proxmox
    assert outcome(result) != "interrupted" and result["isError"] is True, result
    assert "sent nothing" in text(result) and "may or may not" not in text(result), result
    rid = result["_meta"]["pvegate/request_id"]
    closing = [r for r in audit_rows(api.env.config.audit_path, rid) if r["kind"] in ("result", "refusal")]
    assert [(r["kind"], r["outcome"]) for r in closing] == [("refusal", "refused")], closing
    assert json.loads(closing[0]["body"])["sent"] is False
    assert rid not in outcomes.unsettled  # nothing for reconciliation to look for in Proxmox
    # its approval is given back: the retry after the restart may present it again
    state = await _state(api, aid)
    assert state["state"] == "approved" and state["used_by_request"] is None, state
    assert len(_released(api, result, aid)) == 1
