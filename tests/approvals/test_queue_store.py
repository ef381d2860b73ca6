"""The queue's paging in the store, on both backends (SQLite and a real PostgreSQL): the state filter
is SQL's, pending requests come first (the one expiring soonest first), and a cursor reaches every
request of the view exactly once. Regression tests for the 200/300-newest-rows queue views
(tests/approvals/test_queue_paging.py has the history and the HTTP side)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.admin.console.views import queue_page
from gateway.core.principal import Principal
from gateway.store.approvals import ApprovalRequest, ApprovalStore, BadCursor
from gateway.store.db import PostgresDatabase, SqliteDatabase
from gateway.store.schema import upgrade_all
from tests.approvals.test_queue_paging import flood, held
from tests.pgserver import PostgresServer


def approver(sub: str) -> Principal:
    return Principal(sub, "test", (), ("sre-leads",), (), None, "human")


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    if request.param == "sqlite":
        s = ApprovalStore(SqliteDatabase(tmp_path / "approvals.db"))
    else:
        server: PostgresServer = request.getfixturevalue("postgres")
        dsn = await server.create_database("t_")
        db = PostgresDatabase(dsn)
        await db.open()
        try:
            await upgrade_all(db)
        finally:
            await db.close()
        s = ApprovalStore(PostgresDatabase(dsn))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def test_a_live_request_is_not_pushed_out_of_the_queue_by_newer_ones(store: ApprovalStore) -> None:
    victim, _ = await store.find_or_create(held("victim-agent", 0))
    noisy = await flood(store, 320)
    # closed requests, newer than every pending one: the console's "open" view must not spend rows on them
    for i in range(5):
        done, _ = await store.find_or_create(held("done-agent", 1000 + i))
        assert (await store.vote(done.id, approver("alice"), "deny", None, None)).ok
    ok, _ = await store.find_or_create(held("ok-agent", 2000))
    assert (await store.vote(ok.id, approver("alice"), "approve", None, None, ["sre-leads"])).state == "approved"

    # the operator API's first page (the CLI's list too): the request expiring soonest is on it
    first = await store.list("pending")
    assert len(first) == 200 and first[0].id == victim.id
    assert all(r.state == "pending" for r in first)

    # paging reaches every pending request exactly once, in expiry order
    seen: list[ApprovalRequest] = []
    cursor: str | None = None
    pages = 0
    while True:
        items, cursor = await store.page(["pending"], 100, cursor)
        seen += items
        pages += 1
        if cursor is None:
            break
    assert pages == 4 and [r.id for r in seen] == [victim.id, *noisy]
    assert [r.expires_at for r in seen] == sorted(r.expires_at for r in seen)

    # the console's default view: pending (soonest expiry first), then approved; nothing closed
    items, cursor = await queue_page(store, "open", limit=100)
    assert items[0].id == victim.id and cursor is not None
    everything = list(items)
    while cursor is not None:
        items, cursor = await queue_page(store, "open", cursor, limit=100)
        everything += items
    assert [r.id for r in everything] == [victim.id, *noisy, ok.id]

    # one state: only that state's rows, newest first
    denied, cursor = await queue_page(store, "denied", limit=3)
    assert [r.state for r in denied] == ["denied"] * 3 and cursor is not None
    rest, cursor = await queue_page(store, "denied", cursor, limit=3)
    assert len(rest) == 2 and cursor is None
    stamps = [r.created_at for r in denied + rest]
    assert stamps == sorted(stamps, reverse=True)

    # "all": every row once, pending first
    all_rows, cursor = await queue_page(store, "all", limit=500)
    assert cursor is None and len(all_rows) == 1 + 320 + 5 + 1 and all_rows[0].id == victim.id


async def test_a_cursor_keeps_its_place_while_new_requests_arrive(store: ApprovalStore) -> None:
    early = await flood(store, 30, "early-agent")
    page1, cursor = await store.page(["pending"], 10)
    await flood(store, 50, "late-agent")  # newer requests expire later: they queue behind
    rest: list[ApprovalRequest] = []
    while cursor is not None:
        items, cursor = await store.page(["pending"], 10, cursor)
        rest += items
    ids = [r.id for r in page1 + rest]
    assert ids[:30] == early and len(ids) == len(set(ids)) == 80


async def test_a_damaged_cursor_is_refused(store: ApprovalStore) -> None:
    await flood(store, 3)
    for bad in ("x", "bm90IGpzb24", "WzIsMSwiYSJd", "WzAsTmFOLCJhIl0", "W10", "a" * 500):
        with pytest.raises(BadCursor):
            await store.page(["pending"], 10, bad)
    with pytest.raises(ValueError):
        await store.page(["pending"], 0)
