"""Quotas hold under concurrency: each call's usage counters include the calls in flight
before it (the security review raced 30 parallel calls past a limit of 10).

On a loaded machine OPA may not answer a few of the 30 within the timeout: those calls fail
closed (policy.unavailable). While they wait they count as in flight, as every undecided call
must (else the limit could be raced past), so calls decided meanwhile may see the quota full
and be denied. A failed-closed call gives its slot back: the quota is then reached exactly by
calls made afterwards, and never passed.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.policy.decisions import FAIL_CLOSED_CODE
from tests.support import GatewayThread, audit_rows

LIMIT = 10  # policy: agents make at most 10 writes per tool per minute
QUOTA = "quota.exceeded"


async def test_concurrent_writes_cannot_race_past_the_quota(gateway: GatewayThread, env: DevEnv) -> None:
    sub = f"racer-{uuid.uuid4().hex[:8]}"  # a fresh principal: its counters start at zero
    token = env.token(sub, ["operator"])
    # dry runs of a dev guest's reboot: no approval rule applies, nothing is sent to Proxmox
    args = {"vmid": 103}  # the node is looked up: other tests may have migrated the guest

    async def one() -> str:
        """'allowed', or the denial's code: the quota's, or a failed-closed policy decision's."""
        async with mcp_client(env.url, token, env.ca_file) as client:
            res = await client.call_tool("vm_reboot", args, meta={"dry_run": True})  # type: ignore[arg-type]
        outcome = str((res.meta or {}).get("pvegate/outcome"))
        assert outcome in ("allowed", "denied"), res.content[0].text  # a dry run sends nothing, so cannot fail
        if outcome == "allowed":
            return outcome
        codes = (res.structured_content or {}).get("codes")
        assert codes in ([QUOTA], [FAIL_CLOSED_CODE]), res.content[0].text
        return str(codes[0])

    burst = await asyncio.gather(*(one() for _ in range(30)))
    allowed, failed_closed = burst.count("allowed"), burst.count(FAIL_CLOSED_CODE)
    assert allowed <= LIMIT, burst  # the security property: never past the limit
    # a call can only be denied for a slot taken by an allowed call or one still in flight that failed closed
    assert allowed >= LIMIT - failed_closed, burst
    assert burst.count(QUOTA) == 30 - allowed - failed_closed
    # no denied call keeps a slot: the counter holds the allowed calls alone
    assert gateway.components.usage.counts(sub, "vm_reboot")["tool"]["1m"] == allowed

    # the slots the failed-closed calls held are free again: the quota is reached exactly, then refused
    after: list[str] = []
    while len(after) < 30 and QUOTA not in after:  # bounded: a loaded OPA may fail a few closed again
        after.append(await one())
    assert after[-1] == QUOTA, after
    assert allowed + after.count("allowed") == LIMIT, (burst, after)

    rows = [r for r in audit_rows(env.config.audit_path) if r["principal"] == sub and r["kind"] == "decision"]
    assert sum(r["outcome"] == "allow" for r in rows) == LIMIT
    for r in (r for r in rows if r["outcome"] == "deny"):
        body = json.loads(r["body"])
        assert body["failed_closed"] or (body["quota"] or {}).get("name") == "agent-writes-per-minute", body
