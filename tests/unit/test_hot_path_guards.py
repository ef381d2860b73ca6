"""Small guards on the hot path that the security review asked for."""

from __future__ import annotations

import asyncio

from gateway.store.usage import UsageCounters
from gateway.tools.shaping import drop_sensitive


def test_sensitive_key_value_rows_are_dropped() -> None:
    rows = [{"key": "cipassword", "value": "hunter2"}, {"key": "memory", "value": 2048}]
    assert drop_sensitive(rows, frozenset({"cipassword"})) == [{"key": "memory", "value": 2048}]
    assert drop_sensitive({"a": {"cipassword": "x", "b": 1}}, frozenset({"cipassword"})) == {"a": {"b": 1}}


async def test_reserved_slots_are_seen_by_concurrent_calls() -> None:
    usage = UsageCounters()
    seen: list[int] = []

    async def call() -> None:
        counts, _ = usage.reserve("agent", "vm_reboot")
        seen.append(counts["tool"]["1m"])
        await asyncio.sleep(0.01)  # the OPA query and audit commit happen here

    await asyncio.gather(*(call() for _ in range(30)))
    assert sorted(seen) == list(range(30))  # each call saw every call before it


def test_released_slot_no_longer_counts() -> None:
    usage = UsageCounters()
    _, a = usage.reserve("agent", "vm_reboot")
    _, b = usage.reserve("agent", "vm_reboot")
    usage.release("agent", "vm_reboot", b)
    counts, _ = usage.reserve("agent", "vm_reboot")
    assert counts["tool"]["1m"] == 1 and counts["all"]["1m"] == 1
    assert a <= b


def test_dry_run_digests_differently() -> None:
    from gateway.tools.tool import arguments_digest

    args = {"node": "pve1", "vmid": 100}
    assert arguments_digest("vm_stop", args) != arguments_digest("vm_stop", args, dry_run=True)
    assert arguments_digest("vm_stop", args) == arguments_digest("vm_stop", dict(reversed(args.items())))


def test_approval_facts_report_the_voters_groups() -> None:
    import json

    from gateway.store.approvals import _voter_groups

    votes = [
        {
            "approver": "bob",
            "verdict": "approve",
            "approver_facts": json.dumps({"groups": [], "qualified_groups": ["ops-approvers"]}),
        },
        {"approver": "eve", "verdict": "approve", "approver_facts": "not json"},
    ]
    assert _voter_groups(votes) == ["ops-approvers"]
