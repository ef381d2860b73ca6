"""The per-principal limits (gateway/store/principal_limits.py, and their MCP door) on their own: the
sliding refusal window, the in-flight cap, and the door refusals' summaries (one row per principal
and window, none in full)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from gateway.mcp.principal_limits import TOO_MANY_REQUESTS, PrincipalLimited, door
from gateway.store.audit import AuditLog
from gateway.store.auth_failures import SUPPRESSED
from gateway.store.principal_limits import INFLIGHT, REFUSAL_BUDGET, DoorRefusals, PrincipalLimits
from tests.unit.test_auth_failures import Clock, FakeAudit


def limits(audit: FakeAudit, clock: Clock, wall: Clock, **kw: int) -> PrincipalLimits:
    reasons: list[str] = []
    lim = PrincipalLimits(
        max_inflight=kw.get("inflight", 2),
        refusals_per_window=kw.get("budget", 3),
        summaries=DoorRefusals(cast(AuditLog, audit), clock=wall),
        on_limited=reasons.append,
        clock=clock,
    )
    lim.reasons = reasons  # type: ignore[attr-defined]
    return lim


async def refused_at_door(lim: PrincipalLimits, who: str) -> PrincipalLimited:
    with pytest.raises(PrincipalLimited) as err:
        async with door(lim, who):
            pass
    return err.value


async def test_the_budget_is_a_sliding_window_of_refusals() -> None:
    clock, wall = Clock(1000.0), Clock()
    lim = limits(FakeAudit(), clock, wall)
    for t in (1000.0, 1010.0, 1020.0):
        clock.now = t
        lim.refused("a")
    clock.now = 1025.0
    assert lim.throttled_for("a") == pytest.approx(35.0)
    assert lim.throttled_for("b") is None
    fault = await refused_at_door(lim, "a")
    assert (fault.code, fault.data) == (TOO_MANY_REQUESTS, {"reason": REFUSAL_BUDGET, "retry_after_seconds": 35})
    assert fault.audited  # never written one by one
    async with lim.admit("b"):  # another principal
        pass
    clock.now = 1060.0  # the oldest is a window old: room for one
    async with lim.admit("a"):
        pass
    lim.refused("a")
    assert lim.throttled_for("a") == pytest.approx(10.0)  # until the second oldest is a window old


async def test_the_in_flight_cap_is_per_principal() -> None:
    lim = limits(FakeAudit(), Clock(), Clock(), inflight=2)
    release = asyncio.Event()

    async def hold(who: str) -> None:
        async with door(lim, who):
            await release.wait()

    tasks = [asyncio.create_task(hold("a")) for _ in range(2)]
    while lim.inflight.get("a") != 2:
        await asyncio.sleep(0)
    fault = await refused_at_door(lim, "a")
    assert fault.data == {"reason": INFLIGHT, "retry_after_seconds": 1}
    other = asyncio.create_task(hold("b"))
    while lim.inflight.get("b") != 1:
        await asyncio.sleep(0)
    release.set()
    await asyncio.gather(*tasks, other)
    assert lim.inflight == {}
    assert lim.reasons == [INFLIGHT]  # type: ignore[attr-defined]


async def test_door_refusals_give_one_summary_per_principal_and_window() -> None:
    audit, clock, wall = FakeAudit(), Clock(), Clock()
    lim = limits(audit, clock, wall, budget=1)
    for who in ("a", "b"):
        lim.refused(who)
    for _ in range(500):
        await refused_at_door(lim, "a")
    for _ in range(7):
        await refused_at_door(lim, "b")
    await lim.limited("a", REFUSAL_BUDGET, "protocol_error")
    assert audit.records == []  # nothing written within the window
    wall.now += 60
    await lim.summaries.sweep()
    rows = {r.principal: r for r in audit.records}
    assert len(audit.records) == 2 and set(rows) == {"a", "b"}
    a = rows["a"]
    assert (a.kind, a.outcome) == ("refusal", SUPPRESSED)
    assert a.body is not None and a.body["principal"] == "a" and a.body["count"] == 501
    assert a.body["outcomes"] == {REFUSAL_BUDGET: 500, "protocol_error": 1} and a.body["audited"] == 0
    assert "source_ip" not in a.body


async def test_door_refusals_left_at_shutdown_are_written_when_the_summaries_close() -> None:
    audit, wall = FakeAudit(), Clock()
    lim = limits(audit, Clock(), wall, budget=1)
    lim.refused("a")
    for _ in range(3):
        await refused_at_door(lim, "a")
    assert audit.records == []  # counted, in the current window
    await lim.summaries.close()  # Components.close does it before the audit closes
    assert [(r.principal, (r.body or {}).get("count")) for r in audit.records] == [("a", 3)]


def test_principals_refused_long_ago_are_forgotten() -> None:
    clock = Clock(0.0)
    lim = limits(FakeAudit(), clock, Clock())
    for i in range(100):
        lim.refused(f"p{i}")
    clock.now = 61.0
    lim.refused("late")
    assert set(lim.refusals) == {"late"}


def test_the_limits_are_at_least_one() -> None:
    with pytest.raises(ValueError):
        PrincipalLimits(max_inflight=0, refusals_per_window=1, summaries=DoorRefusals(cast(AuditLog, FakeAudit())))
    with pytest.raises(ValueError):
        PrincipalLimits(max_inflight=1, refusals_per_window=0, summaries=DoorRefusals(cast(AuditLog, FakeAudit())))


async def test_a_sub_that_is_a_star_is_not_the_aggregate_of_folded_principals() -> None:
    audit, wall = FakeAudit(), Clock()
    summaries = DoorRefusals(cast(AuditLog, audit), clock=wall, max_sources=2, max_summaries=10)
    for sub in ("*", "x", "y", "y"):
        await summaries.count(sub, INFLIGHT)
    await summaries.close()
    rows = sorted(
        ((r.principal or "-"), (r.body or {}).get("principal"), (r.body or {}).get("count")) for r in audit.records
    )
    # "*" and "x" named; "y" folded beyond max_sources into the aggregate, which names no principal
    assert rows == [("*", "*", 1), ("-", "*", 2), ("x", "x", 1)], rows
