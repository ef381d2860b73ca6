"""The auth-failure bound (gateway/store/auth_failures.py) on its own: rows per source and window, the
summary that carries the rest, the bounded map of sources, and that no count is lost (a failed write,
the background sweep, shutdown)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from typing import Any, cast

import pytest

from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.auth_failures import AGGREGATE, SUPPRESSED, AuthFailures, source_of


class FakeAudit:
    def __init__(self) -> None:
        self.records: list[AuditRecord] = []
        self.transactions: list[tuple[AuditRecord, ...]] = []
        self.failing = False

    async def append(self, *records: AuditRecord) -> None:
        if self.failing:
            raise sqlite3.OperationalError("database or disk is full")
        self.transactions.append(records)
        self.records.extend(records)

    def full(self) -> list[AuditRecord]:
        return [r for r in self.records if r.outcome != SUPPRESSED]

    def summaries(self) -> list[dict[str, Any]]:
        return [r.body or {} for r in self.records if r.outcome == SUPPRESSED]


class Clock:
    def __init__(self, now: float = 6_000_000.0) -> None:  # a window's start (a multiple of 60)
        self.now = now

    def __call__(self) -> float:
        return self.now


def failure(ip: str | None, outcome: str = "invalid_token") -> AuditRecord:
    return AuditRecord(uuid.uuid4().hex, "auth_failure", outcome=outcome, body={"reason": "x", "source_ip": ip})


def limiter(audit: FakeAudit, clock: Clock, **kw: Any) -> AuthFailures:
    return AuthFailures(cast(AuditLog, audit), clock=clock, **kw)


async def send(af: AuthFailures, ip: str | None, n: int, surface: str = "mcp", outcome: str = "invalid_token") -> None:
    for _ in range(n):
        await af.record(failure(ip, outcome), source_ip=ip, surface=surface)


async def test_rows_per_source_then_one_summary_in_the_next_window() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=5)
    await send(af, "127.0.0.1", 5 + 15)
    assert len(audit.full()) == 5 and audit.summaries() == []
    await send(af, "10.0.0.9", 2)  # another address has its own budget
    assert len(audit.full()) == 7
    assert af.counts[("mcp", "row")] == 7 and af.counts[("mcp", SUPPRESSED)] == 15
    assert af.pending() == 15

    clock.now += 60  # the next window: its first failure brings the summary, in the same transaction
    await send(af, "127.0.0.1", 1)
    (summary,) = audit.summaries()
    assert summary["source_ip"] == "127.0.0.1" and summary["count"] == 15 and summary["audited"] == 5
    assert summary["outcomes"] == {"invalid_token": 15} and summary["surfaces"] == {"mcp": 15}
    assert summary["window_start"] == "1970-03-11T10:40:00.000Z" and summary["window_end"] == "1970-03-11T10:41:00.000Z"
    last = audit.transactions[-1]
    assert [r.outcome for r in last] == [SUPPRESSED, "invalid_token"]
    assert len(audit.full()) == 8 and af.pending() == 0
    # a window without suppression leaves no summary
    clock.now += 60
    await send(af, "127.0.0.1", 1)
    assert len(audit.summaries()) == 1


async def test_surfaces_share_the_budget_and_are_told_apart() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=3)
    await send(af, "192.0.2.7", 3, surface="mcp")
    await send(af, "192.0.2.7", 2, surface="admin", outcome="wrong_credential")
    await send(af, "192.0.2.7", 1, surface="metrics")
    assert len(audit.full()) == 3
    await af.close()
    (summary,) = audit.summaries()
    assert summary["count"] == 3
    assert summary["surfaces"] == {"admin": 2, "metrics": 1}
    assert summary["outcomes"] == {"invalid_token": 1, "wrong_credential": 2}
    assert summary["window_end"] == summary["window_start"]  # shutdown at the window's first instant


async def test_the_map_of_sources_is_bounded() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=2, max_sources=100, total=10**6)
    for i in range(5000):  # 5000 addresses, 3 failures each
        await send(af, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 3)
    assert len(af._sources) <= 101  # the tracked addresses, plus the aggregate
    assert AGGREGATE in af._sources
    # 100 tracked addresses: 2 rows each; the aggregate: 2 rows for all the others together
    assert len(audit.full()) == 100 * 2 + 2
    assert af.counts[("mcp", "row")] + af.counts[("mcp", SUPPRESSED)] == 15000
    clock.now += 60
    await send(af, "127.0.0.1", 1)
    summaries = audit.summaries()
    assert len(summaries) == 101
    aggregate = [s for s in summaries if s["source_ip"] == AGGREGATE]
    assert len(aggregate) == 1 and aggregate[0]["count"] == 4900 * 3 - 2
    assert sum(s["count"] for s in summaries) == 15000 - 202  # every failure: a row or a count
    assert len(af._sources) == 1  # the new window starts empty


async def test_rows_in_all_are_bounded_too() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=2, total=10)
    for i in range(20):
        await send(af, f"198.51.100.{i}", 2)
    assert len(audit.full()) == 10
    # every address is still tracked by itself (only the memory bound folds them): counted, not written
    assert len(af._sources) == 20 and AGGREGATE not in af._sources
    clock.now += 60
    await af.sweep()
    # at most `total` summaries a window; the rest folded into one aggregate, no count lost
    summaries = audit.summaries()
    named = [s for s in summaries if s["source_ip"] != AGGREGATE]
    folded = [s for s in summaries if s["source_ip"] == AGGREGATE]
    assert len(named) == 10 and len(folded) == 1
    assert sum(s["count"] for s in summaries) == 30


async def test_an_attacker_cannot_hide_behind_a_spent_window() -> None:
    """Found in review: once others' failures spent the window's rows, a new address went into the
    aggregate and no row or summary named it. Now it is tracked, and the largest counts are named."""
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=2, total=10)
    for i in range(30):  # decoys spend the rows and crowd the summaries
        await send(af, f"198.51.100.{i}", 3)
    await send(af, "203.0.113.66", 500)  # the brute force
    clock.now += 60
    await af.sweep()
    attacker = [s for s in audit.summaries() if s["source_ip"] == "203.0.113.66"]
    assert attacker and attacker[0]["count"] == 500


def test_an_ipv6_client_is_one_source_per_64() -> None:
    assert source_of("2001:db8:1:2::1") == source_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("::ffff:192.0.2.1") == "192.0.2.1"
    assert source_of("192.0.2.1") == "192.0.2.1" and source_of(None) is None and source_of("test") == "test"


async def test_an_unwritten_summary_is_kept_and_written_later() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=1)
    await send(af, "127.0.0.1", 4)
    clock.now += 60
    audit.failing = True
    with pytest.raises(sqlite3.OperationalError):  # the failure's own row cannot be written: as before
        await send(af, "127.0.0.1", 1)
    assert af.pending() == 3
    audit.failing = False
    await af.close()
    (summary,) = audit.summaries()
    assert summary["count"] == 3


async def test_the_sweep_writes_the_summary_when_no_failure_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.store.auth_failures.SWEEP_MARGIN_SECONDS", 0.05)
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=2, window_seconds=0.2)
    await send(af, "127.0.0.1", 5)
    assert af._sweeper is not None
    clock.now += 0.2  # the window is over; the sweep wakes up about then (it sleeps the rest of the window)
    for _ in range(100):
        if audit.summaries():
            break
        await asyncio.sleep(0.05)
    (summary,) = audit.summaries()
    assert summary["count"] == 3
    await af.close()
    assert len(audit.summaries()) == 1  # nothing written twice


async def test_close_writes_the_current_window_and_never_raises() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=1)
    await send(af, "127.0.0.1", 3)
    clock.now += 7
    await af.close()
    (summary,) = audit.summaries()
    assert summary["count"] == 2 and summary["window_end"] == "1970-03-11T10:40:07.000Z"

    broken, clock = FakeAudit(), Clock()
    af = limiter(broken, clock, per_source=1)
    await send(af, "127.0.0.1", 3)
    broken.failing = True
    await af.close()  # logged, not raised: the rest of the shutdown goes on


def refusal(ip: str | None, outcome: str = "host_refused") -> AuditRecord:
    """What the transport guard writes before authentication (gateway/mcp/security.py)."""
    return AuditRecord(uuid.uuid4().hex, "refusal", outcome=outcome, body={"reason": "x", "source_ip": ip, "path": "/"})


def sign_in_refused(ip: str | None) -> AuditRecord:
    """What the console's /admin/callback writes for a refused sign-in (gateway/admin/console/views.py)."""
    body = {"action": "sign_in", "surface": "console", "source_ip": ip, "reason": "x"}
    return AuditRecord(uuid.uuid4().hex, "console", outcome="refused", body=body)


async def test_refusals_share_the_budget_and_their_summaries_keep_their_kind() -> None:
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=3)
    ip = "127.0.0.1"
    await send(af, ip, 2)  # two auth failures: rows
    for outcome in ("host_refused", "origin_refused", "host_refused"):  # the budget's last row, then counted
        await af.record(refusal(ip, outcome), source_ip=ip, surface="transport")
    for _ in range(2):  # the budget is spent: only counted
        await af.record(sign_in_refused(ip), source_ip=ip, surface="console")
    await send(af, ip, 1)
    assert [(r.kind, r.outcome) for r in audit.full()] == [
        ("auth_failure", "invalid_token"),
        ("auth_failure", "invalid_token"),
        ("refusal", "host_refused"),
    ]
    assert af.counts[("transport", "row")] == 1 and af.counts[("transport", SUPPRESSED)] == 2
    assert af.counts[("console", "row")] == 0 and af.counts[("console", SUPPRESSED)] == 2
    assert af.pending() == 5
    await af.record(refusal("10.0.0.9"), source_ip="10.0.0.9", surface="transport")  # its own budget
    assert len(audit.full()) == 4

    clock.now += 60
    await send(af, ip, 1)
    summaries = {(r.kind, r.outcome): r.body or {} for r in audit.records if r.outcome == SUPPRESSED}
    assert set(summaries) == {("auth_failure", SUPPRESSED), ("refusal", SUPPRESSED), ("console", SUPPRESSED)}
    auth, refused, console = (summaries[(k, SUPPRESSED)] for k in ("auth_failure", "refusal", "console"))
    assert (auth["count"], auth["audited"], auth["surfaces"]) == (1, 2, {"mcp": 1})
    assert (refused["count"], refused["audited"]) == (2, 1)
    assert refused["outcomes"] == {"host_refused": 1, "origin_refused": 1} and refused["surfaces"] == {"transport": 2}
    assert "refusal(s) before authentication" in refused["reason"] and "action" not in refused
    assert (console["count"], console["audited"], console["action"]) == (2, 0, "sign_in")
    assert console["outcomes"] == {"refused": 2} and console["surfaces"] == {"console": 2}
    assert all(s["source_ip"] == ip and s["window_start"] < s["window_end"] for s in summaries.values())
    assert af.pending() == 0


async def test_folded_summaries_keep_their_kind() -> None:
    """A store down for long: the kept summaries are folded into one per kind, not into auth failures."""
    audit, clock = FakeAudit(), Clock()
    af = limiter(audit, clock, per_source=1, max_sources=2)
    await send(af, "192.0.2.1", 3)
    for _ in range(3):
        await af.record(refusal("192.0.2.2"), source_ip="192.0.2.2", surface="transport")
    for _ in range(3):  # a third source: the aggregate
        await af.record(sign_in_refused("192.0.2.3"), source_ip="192.0.2.3", surface="console")
    clock.now += 60
    audit.failing = True
    await af.sweep()  # three summaries unwritten: more than max_sources, folded
    assert len(af._unwritten) == 3 and af.pending() == 6
    audit.failing = False
    await af.close()
    got = sorted(
        (r.kind, (r.body or {})["source_ip"], (r.body or {})["count"]) for r in audit.records if r.outcome == SUPPRESSED
    )
    assert got == [("auth_failure", AGGREGATE, 2), ("console", AGGREGATE, 2), ("refusal", AGGREGATE, 2)]
