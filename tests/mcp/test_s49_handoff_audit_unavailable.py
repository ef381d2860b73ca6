"""An approved retry refused because the audit store cannot take writes keeps its hand-off.

What was wrong: a 2026-07-28 retry's requestState is spent (and a 2025-11-25 hand-off taken) before the
call runs. When the call was then refused with AUDIT_UNAVAILABLE (HTTP 503, Retry-After: "nothing was
sent to Proxmox. Retry later"), the approval was still approved and unused, but the handle was gone:
the retry the 503 asks for was refused ("requestState refused (already used)"), or for 2025-11-25
opened a second approval request beside the approved one. The client did exactly what it was told and
lost the human's approval. The refusals before sending that are tool results (OPA down) kept the
handle already; the 503 path did not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.approvals.conftest import Api
from tests.mcp.test_handoff import approved_retry, approver, legacy_client, shutdown_args, shutdowns


@contextlib.contextmanager
def audit_full(agw: Any) -> Iterator[None]:
    """The audit store's filesystem below its reserve: every call is refused with AUDIT_UNAVAILABLE."""
    outcomes = agw.components.outcomes
    assert outcomes.audit.local_dir is not None  # SQLite: the reserve is checked on its directory
    before = outcomes.min_free_bytes
    outcomes.min_free_bytes = 1 << 62
    try:
        yield
    finally:
        outcomes.min_free_bytes = before


def test_s49_request_state_survives_an_audit_unavailable_refusal(api: Api, asim: Any, agw: Any) -> None:
    args = shutdown_args()
    with approved_retry(api, args) as (post, retry):
        with audit_full(agw):
            refused = post(retry)
        assert refused.status_code == 503 and "Retry" in refused.json()["error"]["message"], refused.text
        assert shutdowns(asim, args["timeout"]) == 0
        again = post(retry)  # the retry the 503 asked for, with the same requestState
        assert again.status_code == 200, again.text
        assert again.json()["result"]["_meta"]["pvegate/outcome"] in ("allowed", "failed"), again.text
    assert shutdowns(asim, args["timeout"]) == 1


async def test_s49_2025_11_25_hand_off_survives_an_audit_unavailable_refusal(api: Api, asim: Any, agw: Any) -> None:
    args = shutdown_args()
    async with legacy_client(api) as client:
        with pytest.raises(MCPError) as info:
            await client.call_tool("vm_shutdown", args)
        aid = info.value.error.data["elicitations"][0]["elicitationId"]
        assert (await api.vote(aid, approver(api))).status_code == 200
        with audit_full(agw), pytest.raises(MCPError) as refused:
            await client.call_tool("vm_shutdown", args)
        assert "audit store cannot take writes" in refused.value.error.message
        res = await client.call_tool("vm_shutdown", args)  # the identical retry: the approved call, not a new request
    assert res.meta and res.meta["pvegate/outcome"] in ("allowed", "failed"), res
    assert shutdowns(asim, args["timeout"]) == 1
