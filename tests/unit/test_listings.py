"""The listing cache's key and bookkeeping."""

from __future__ import annotations

from typing import Any

from gateway.policy.listings import ListingCache, listing_key


def _input(**request: Any) -> dict[str, Any]:
    facts = {"id": "r1", "method": "tools/list", "protocol_version": "2025-06-18", "time": "2026-11-29T18:00:00Z"}
    facts |= {"time_ns": 1, "weekday": "Sun", "hour_utc": 18, "source_ip": "10.0.0.1"} | request
    principal = {"sub": "agent", "kind": "agent", "roles": ["operator"], "groups": [], "scopes": []}
    return {"contract_version": 1, "kind": "list", "principal": principal, "request": facts, "tools": [{"name": "x"}]}


def test_key_ignores_only_the_request_id_and_clock() -> None:
    base = listing_key(_input())
    assert listing_key(_input(id="r2", time="2026-11-29T18:00:09Z", time_ns=9)) == base
    assert listing_key(_input(hour_utc=19)) != base
    assert listing_key(_input(weekday="Mon")) != base
    assert listing_key(_input(source_ip="10.0.0.2")) != base
    assert listing_key(_input(protocol_version="2025-11-25")) != base
    other = _input()
    other["principal"] = {**other["principal"], "groups": ["ops"]}
    assert listing_key(other) != base


def test_entries_expire_and_the_oldest_make_room() -> None:
    now = [0.0]
    cache = ListingCache(ttl=10, max_entries=2, clock=lambda: now[0])
    cache.put("a", frozenset({"t1"}))
    now[0] = 1
    cache.put("b", frozenset({"t2"}))
    assert cache.get("a") == frozenset({"t1"})
    now[0] = 5
    cache.put("c", frozenset())
    assert cache.get("a") is None and cache.get("b") == frozenset({"t2"}) and len(cache) == 2
    now[0] = 11.5
    assert cache.get("b") is None  # ten seconds after it was kept
    assert cache.get("c") == frozenset()


def test_a_zero_ttl_keeps_nothing() -> None:
    cache = ListingCache(ttl=0)
    cache.put("a", frozenset({"t1"}))
    assert cache.get("a") is None and len(cache) == 0
