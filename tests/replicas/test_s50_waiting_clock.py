"""A retry of a held call was judged "still pending" or "expired" by the asking replica's own clock.

`Approvals.waiting` (a verified retry naming its approval request, before an approver voted) compared the
request's `expires_at`, set on the database's clock (`find_or_replace`), with the replica's `time.time()`.
docs/deployment.md promises every expiry is set and checked on the database's clock, so replicas with
skewed clocks agree. A replica whose clock lags answered a request already expired (no vote can be cast on
it any more) as "still held, wait for the approver", with a fresh retry handle for it, while the other
replicas refused it; a replica whose clock runs ahead refused a live request as not pending, losing the
agent's retry handle. Two stores on one real PostgreSQL stand for two replicas; only the lagging or
leading replica's wall clock is moved.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import AsyncIterator

import pytest

import gateway.store.approvals as approvals_module
from gateway.core.principal import Principal
from gateway.store.approvals import APPROVAL_REQUEST_META, Approvals, ApprovalStore
from tests.approvals.test_queue_paging import TARGET, held
from tests.pgserver import PostgresServer
from tests.store.auditstore import approval_replicas, new_pg_database

AGENT = Principal("agent-s50", "test", ("operator",), (), (), None, "agent")
SKEW_SECONDS = 120.0


@pytest.fixture
async def replicas(postgres: PostgresServer) -> AsyncIterator[tuple[ApprovalStore, ApprovalStore]]:
    async with approval_replicas(await new_pg_database(postgres, "wait_")) as stores:
        yield stores


def skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The replica's wall clock `seconds` off the database's (the same host here: its real clock)."""
    fake = types.SimpleNamespace(time=lambda: time.time() + seconds, monotonic=time.monotonic)
    monkeypatch.setattr(approvals_module, "time", fake)


async def test_a_lagging_replica_does_not_hold_a_request_expired_on_the_database_clock(
    replicas: tuple[ApprovalStore, ApprovalStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = replicas
    req, created = await a.find_or_create(held(AGENT.sub, 1, ttl=1))
    assert created
    await asyncio.sleep(1.5)  # expired by the database's clock; no sweep has run yet
    skew(monkeypatch, -SKEW_SECONDS)
    meta = {APPROVAL_REQUEST_META: req.id}
    found = await Approvals(b).waiting(meta, AGENT, req.tool, req.arguments_digest, TARGET)
    assert found is None, f"request {req.id} expired on the database's clock is still held on a lagging replica"


async def test_a_leading_replica_still_holds_a_live_request(
    replicas: tuple[ApprovalStore, ApprovalStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = replicas
    req, created = await a.find_or_create(held(AGENT.sub, 2, ttl=60))
    assert created
    skew(monkeypatch, SKEW_SECONDS)
    meta = {APPROVAL_REQUEST_META: req.id}
    found = await Approvals(b).waiting(meta, AGENT, req.tool, req.arguments_digest, TARGET)
    assert found is not None and found.id == req.id, "a live request is refused as expired on a leading replica"
