"""A requestState's nonce is single-use on every replica, whatever a replica's own clock says.

Nonces are kept in the shared database (store/handoffs.py) until a minute after their token's expiry,
by the database's clock; every `use_once` sweeps the lapsed ones. A replica whose clock lags the
database's by more than that minute still takes a token as live (RequestStates.redeem checks `exp`
against the replica's own clock) after its nonce was swept: the same requestState was then redeemed
again on that replica. The database's clock, the one every replica shares, decides: a token expired by
it is never taken, so none can outlive its nonce.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.store.db import Database
from gateway.store.handoffs import MIGRATIONS, SharedStates
from gateway.store.migrations import check


@pytest.fixture
async def shared(make_database: Callable[[], Database]) -> AsyncIterator[tuple[SharedStates, SharedStates]]:
    """The retry state of two replicas on one database (each its own pool or connection)."""
    a, b = make_database(), make_database()
    await a.open()
    await b.open()
    await check(a, "handoffs", MIGRATIONS)
    yield SharedStates(a), SharedStates(b)
    await a.close()
    await b.close()


async def test_a_nonce_swept_as_lapsed_is_never_taken_again_by_a_replica_whose_clock_lags(
    shared: tuple[SharedStates, SharedStates],
) -> None:
    a, b = shared
    # the token expired 90 s ago on the database's clock; a replica whose clock is 2 minutes behind
    # still takes it as live and asks the store for its nonce
    exp = time.time() - 90
    first = await a.use_once("nonce-lagging", exp)
    await b.use_once("nonce-other", time.time() + 600)  # any later use, on any replica, sweeps lapsed nonces
    replay = await b.use_once("nonce-lagging", exp)
    assert [first, replay].count(True) <= 1, (first, replay)
    assert not replay
    # a live token's nonce: once, on any replica
    live = time.time() + 600
    assert await a.use_once("nonce-live", live)
    assert not await b.use_once("nonce-live", live)
