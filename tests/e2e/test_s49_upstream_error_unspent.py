"""An allowed call whose connector ends in `upstream_error` (Proxmox could not be asked: unreachable, TLS, its
401 for the gateway's token, an open circuit, the gateway's connections all busy) sent nothing, and Proxmox
carried out nothing. The pipeline still kept the call's quota slot and the approval it had consumed: the
approver's one-time token was spent on a call that never ran (the retry after the outage was refused `already
used`, and a human had to approve the same call again), and every call an outage refused counted toward the
principal's quotas. docs/approvals.md: "Only a call that was sent spends it"; docs/audit.md: `upstream_error`,
"nothing was sent". Now the slot and the approval are given back, as for a runtime refusal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.store.usage import MemoryQuotas
from tests.approvals.conftest import Api, approvals_env, outcome, text, write_policy_data
from tests.support import GatewayThread, audit_rows

VM = 100  # a running prod guest on pve1: the test policy asks an SRE lead to approve its shutdown
SHUTDOWN = r"/qemu/100/status/shutdown$"


@pytest.fixture
def gw(fsim: Any, tmp_path: Path) -> Iterator[tuple[Api, GatewayThread]]:
    env = approvals_env(fsim, write_policy_data(tmp_path / "policy"), tmp_path / "gw")
    gateway = GatewayThread(env.config).start()
    try:
        yield Api(env), gateway
    finally:
        gateway.stop()


def guest_status(sim: Any) -> str:
    return str(sim.state()["guests"][str(VM)]["status"])


async def test_an_upstream_error_gives_back_the_approval_and_the_quota_slot(
    gw: tuple[Api, GatewayThread], fsim: Any
) -> None:
    api, gateway = gw
    agent, args = api.agent("s49-outage-agent"), {"vmid": VM, "timeout": 30}
    held = await api.call(agent, "vm_shutdown", args)
    assert outcome(held) == "pending_approval", text(held)
    aid = held["structuredContent"]["approval"]["id"]
    vote = await api.vote(aid, api.human("alice", ["sre-leads"]))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    token = vote.json()["token"]

    # Proxmox refuses the gateway's token for the shutdown alone: the lookups work, the call is not carried out
    fsim.set_faults(error_rate=1.0, error_status=401, error_path=SHUTDOWN)
    failed = await api.call(agent, "vm_shutdown", args, approval=token)
    assert outcome(failed) == "failed" and "HTTP 401" in text(failed), text(failed)
    assert guest_status(fsim) == "running"
    # the held request's slot counts (no flooding the approvers); the call that was never sent does not
    quotas = gateway.components.usage
    assert isinstance(quotas, MemoryQuotas)
    assert quotas.counts("s49-outage-agent", "vm_shutdown")["tool"]["1m"] == 1

    fsim.set_faults(error_rate=0.0, error_path=None)
    retried = await api.call(agent, "vm_shutdown", args, approval=token)  # the same token: it was not spent
    assert outcome(retried) == "allowed", text(retried)
    rows = [r for r in audit_rows(api.env.config.audit_path) if r["kind"] == "approval"]
    assert [r["outcome"] for r in rows if aid in r["body"]][-3:] == ["consumed", "released", "consumed"], rows
