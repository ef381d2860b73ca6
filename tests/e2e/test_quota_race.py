"""Quotas hold under concurrency: each call's usage counters include the calls in flight
before it (the security review raced 30 parallel calls past a limit of 10)."""

from __future__ import annotations

import asyncio
import uuid

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread, audit_rows


async def test_concurrent_writes_cannot_race_past_the_quota(gateway: GatewayThread, env: DevEnv) -> None:
    sub = f"racer-{uuid.uuid4().hex[:8]}"  # a fresh principal: its counters start at zero
    token = env.token(sub, ["operator"])
    # dry runs of a dev guest's reboot: no approval rule applies, nothing is sent to Proxmox,
    # and policy limits agents to 10 writes per tool per minute
    args = {"vmid": 103}  # the node is looked up: other tests may have migrated the guest

    async def one() -> str:
        async with mcp_client(env.url, token, env.ca_file) as client:
            res = await client.call_tool("vm_reboot", args, meta={"dry_run": True})  # type: ignore[arg-type]
        outcome = str((res.meta or {}).get("pvegate/outcome"))
        assert outcome in ("allowed", "denied"), res.content[0].text  # a dry run sends nothing, so cannot fail
        return outcome

    outcomes = await asyncio.gather(*(one() for _ in range(30)))
    assert outcomes.count("allowed") == 10, outcomes
    assert outcomes.count("denied") == 20
    rows = [r for r in audit_rows(env.config.audit_path) if r["principal"] == sub and r["kind"] == "decision"]
    assert sum(r["outcome"] == "allow" for r in rows) == 10
    denied = [r for r in rows if r["outcome"] == "deny"]
    assert all("agent-writes-per-minute" in r["body"] for r in denied)
