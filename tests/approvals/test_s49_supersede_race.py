"""A supersession that lost its race was still reported: on PostgreSQL (READ COMMITTED, several replicas)
`find_or_replace` read a live pending request of the same call on other terms, then its conditional UPDATE
(`WHERE state = 'pending'`) waited for a vote in flight on another replica; the vote approved the request
(minting a token), the UPDATE matched nothing, yet the request was still returned as superseded. The
gateway then wrote an `approval` record `superseded` ("can no longer be voted on or redeemed") for a request
that was approved and whose token still worked: the tamper-evident audit contradicting the store. A
request is superseded only when the UPDATE ended it. Real PostgreSQL, two stores on it (two replicas), a
real vote; the interleaving is forced with a table lock held by a third session."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.core.principal import Principal
from gateway.store.approvals import ApprovalStore, VoteOutcome
from tests.approvals.test_queue_paging import held
from tests.pgserver import PostgresServer
from tests.store.auditstore import approval_replicas, new_pg_database


@pytest.fixture
async def dsn(postgres: PostgresServer) -> str:
    return await new_pg_database(postgres, "sup_")


@pytest.fixture
async def replicas(dsn: str) -> AsyncIterator[tuple[ApprovalStore, ApprovalStore]]:
    async with approval_replicas(dsn) as stores:
        yield stores


async def _waiting_on_locks(conn: asyncpg.Connection, n: int) -> None:
    """Until `n` other sessions of this database wait for a lock."""
    for _ in range(500):
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        if waiting >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{n} session(s) never waited for a lock")


async def test_a_request_approved_meanwhile_is_not_reported_superseded(
    dsn: str, replicas: tuple[ApprovalStore, ApprovalStore]
) -> None:
    a, b = replicas
    old, created = await a.find_or_create(held("demo-agent", 7))
    assert created
    # the same call, decided under a changed policy: two approvals now, so the old request is on other terms
    new = held("demo-agent", 7)
    new.min_approvals = 2
    new.id = "apr-" + uuid.uuid4().hex

    gate = await asyncpg.connect(dsn)
    try:
        tx = gate.transaction()
        await tx.start()
        await gate.execute("LOCK TABLE approval_votes IN SHARE MODE")  # the vote stops after locking its row
        alice = Principal("alice", "test", (), ("sre-leads",), (), None, "human")
        vote: asyncio.Task[VoteOutcome] = asyncio.create_task(
            a.vote(old.id, alice, "approve", None, None, ["sre-leads"])
        )
        await _waiting_on_locks(gate, 1)  # replica A holds the request's row, its vote's INSERT waits
        replace = asyncio.create_task(b.find_or_replace(new))
        await _waiting_on_locks(gate, 2)  # replica B read the request as pending; its UPDATE waits for the row
        await tx.commit()
        voted = await vote
        _, made, superseded = await replace
    finally:
        await gate.close()

    assert voted.ok and voted.state == "approved" and voted.token
    assert made
    stored = await a.get(old.id)
    assert stored.state == "approved" and stored.decided_by == "alice"
    # the approval stands (its token works): no supersession of it may be reported, nor recorded
    assert superseded == []
