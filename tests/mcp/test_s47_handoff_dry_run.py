"""A dry run and the real call are two approvals, and two hand-offs (found in review).

The approval's digest counts `_meta.dry_run` (a rehearsal's approval never runs the real call), but the
hand-off's did not: in the 2025-11-25 era a held dry run and the identical real call shared one remembered
hand-off, so the real call was recalled onto the rehearsal's approval request (held "for the same
approval", then refused once it was granted: granted for other arguments) and never got its own request.
Real OPA, approvals and simulator."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.approvals.conftest import Api
from tests.mcp.test_handoff import approver, legacy_client


def _resumes(sim: Any) -> int:
    return sum(1 for r in sim.requests_log() if r["method"] == "POST" and r["path"].endswith("/100/status/resume"))


async def _held(client: Any, args: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(MCPError) as info:
        await client.call_tool("vm_resume", args, **kw)
    assert info.value.error.code == -32042, info.value.error
    return str(info.value.error.data["elicitations"][0]["elicitationId"])


async def test_s47_a_held_dry_run_and_the_real_call_get_their_own_approvals(api: Api, asim: Any) -> None:
    args = {"vmid": 100}  # the approvals data asks an approval for a rehearsal of vm_resume on prod too
    before = _resumes(asim)
    async with legacy_client(api) as client:
        rehearsal = await _held(client, args, meta={"dry_run": True})
        real = await _held(client, args)
        assert real != rehearsal  # the real call is not recalled onto the rehearsal's request
        assert (await api.vote(real, approver(api))).status_code == 200
        res = await client.call_tool("vm_resume", args)
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res
    assert _resumes(asim) == before + 1
