"""Pool holds (gateway/store/holds.py): what allowed allocating calls in flight add to their pool.

In one process (the SQLite backend) and as rows on a real PostgreSQL that two replicas share:
each hold sees every hold taken before it, whichever replica took it; a hold given back or
lapsed no longer counts; a call's hold is kept while its outcome waits for reconciliation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.store.db import PostgresDatabase
from gateway.store.holds import AMOUNTS, CallHold, HoldsUnavailable, MemoryHolds, PoolHolds, SqlHolds
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database


def one(guests: int = 1, cores: int = 2) -> dict[str, int]:
    return {"guests": guests, "cores": cores, "memory_mib": 512, "disk_gib": 8}


async def replicas(postgres: PostgresServer, ttl: float = 3600.0) -> tuple[SqlHolds, SqlHolds]:
    url = await new_pg_database(postgres, "h_")
    a, b = SqlHolds(PostgresDatabase(url), ttl=ttl), SqlHolds(PostgresDatabase(url), ttl=ttl)
    await a.open()
    await b.open()
    return a, b


async def concurrent_takes_see_every_earlier_hold(a: PoolHolds, b: PoolHolds) -> None:
    takes = [(a if i % 2 else b).take("default", "sandbox", one()) for i in range(20)]
    takes.append(a.take("default", "other-pool", one(5, 5)))  # another pool: not counted in sandbox
    takes.append(b.take("other-cluster", "sandbox", one(7, 7)))  # the same pool name on another cluster
    seen = await asyncio.gather(*takes)
    befores = sorted(before["guests"] for before, _ in seen[:20])
    assert befores == list(range(20)), befores  # a total order: each saw all taken before it
    assert sorted(before["cores"] for before, _ in seen[:20]) == list(range(0, 40, 2))
    assert seen[20][0] == seen[21][0] == dict.fromkeys(AMOUNTS, 0)
    for i, (_, handle) in enumerate(seen[:20]):
        await (b if i % 2 else a).give_back(handle)  # a hold is a row: either replica may give it back
    before, _ = await a.take("default", "sandbox", one())
    assert before == dict.fromkeys(AMOUNTS, 0)


async def test_in_one_process() -> None:
    holds = MemoryHolds()
    await concurrent_takes_see_every_earlier_hold(holds, holds)


async def test_two_replicas_on_postgresql(postgres: PostgresServer) -> None:
    a, b = await replicas(postgres)
    try:
        await concurrent_takes_see_every_earlier_hold(a, b)
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("backend", ["memory", "postgresql"])
async def test_a_call_left_to_reconciliation_keeps_its_hold_until_settled_or_lapsed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "memory":
        holds: PoolHolds = MemoryHolds(ttl=1.0)
        other: PoolHolds = holds
    else:
        holds, other = await replicas(request.getfixturevalue("postgres"), ttl=1.0)
    try:
        settled, waiting, unsettled = CallHold(holds, "r1"), CallHold(holds, "r2"), CallHold(holds, "r3")
        assert await settled.take("default", "sandbox", one()) == dict.fromkeys(AMOUNTS, 0)
        assert (await waiting.take("default", "sandbox", one()))["guests"] == 1
        assert (await unsettled.take("default", "sandbox", one()))["guests"] == 2
        with pytest.raises(RuntimeError):  # one hold per call: a second would count it twice
            await waiting.take("default", "sandbox", one())
        await settled.end(keep=False)  # Proxmox answered: given back at once
        await waiting.end(keep=True)  # interrupted: kept (the guest may not be listed yet) ...
        await unsettled.end(keep=True)
        before, _ = await other.take("default", "sandbox", one(0, 0))
        assert before["guests"] == 2
        await other.give_back_call("r2")  # ... until reconciliation settles it, on whichever replica
        before, _ = await other.take("default", "sandbox", one(0, 0))
        assert before["guests"] == 1
        await asyncio.sleep(1.2)  # a crashed replica's rows, too, count only until they lapse
        before, _ = await other.take("default", "sandbox", one(0, 0))
        assert before["guests"] == 0
    finally:
        await holds.close()
        if other is not holds:
            await other.close()


async def test_a_store_that_fails_refuses_the_take_and_an_end_only_logs(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await replicas(postgres)
    await b.close()
    hold = CallHold(a)
    await hold.take("default", "sandbox", one())
    await a.close()  # the store is gone: giving back fails, the call is not failed for it
    await hold.end(keep=False)
    assert "could not be given back" in caplog.text
    with pytest.raises(HoldsUnavailable, match="holds cannot be taken now"):  # the call alone is refused
        await CallHold(a).take("default", "sandbox", one())


async def test_a_running_calls_hold_is_renewed_by_reconciliation() -> None:
    """Reconciliation renews the hold of a call whose task still runs: a clone or restore longer than
    the TTL stays counted (Proxmox may list its guest only when it ends)."""
    holds = MemoryHolds(ttl=1.0)
    await CallHold(holds, "long").take("default", "sandbox", one())
    for _ in range(3):
        await asyncio.sleep(0.6)
        await holds.renew_call("long")  # a reconciliation pass found its task running
    before, _ = await holds.take("default", "sandbox", one(0, 0))
    assert before["guests"] == 1  # 1.8 s after it was taken, TTL 1 s: still held
    await asyncio.sleep(1.1)
    before, _ = await holds.take("default", "sandbox", one(0, 0))
    assert before["guests"] == 0  # not renewed: lapsed


async def test_renewal_on_postgresql(postgres: PostgresServer) -> None:
    a, b = await replicas(postgres, ttl=1.0)
    try:
        await CallHold(a, "long").take("default", "sandbox", one())
        await asyncio.sleep(0.7)
        await b.renew_call("long")  # whichever replica reconciles it
        await asyncio.sleep(0.7)
        before, _ = await b.take("default", "sandbox", one(0, 0))
        assert before["guests"] == 1
    finally:
        await a.close()
        await b.close()


def test_a_decision_record_shows_the_hold_its_call_took_and_no_other() -> None:
    """What a restart takes again (Reconciler.read_earlier): the hold a decision's policy input shows,
    only when its call took one (`pool_in_flight` is there only then)."""
    from gateway.store.reconcile import held_by

    res = {"requested": one(), "pool": "sandbox", "pool_usage": one(), "pool_in_flight": one(0, 0)}
    assert held_by({"target": {"cluster": "default"}, "resources": res}) == ("default", "sandbox", one())
    unheld = {k: v for k, v in res.items() if k != "pool_in_flight"}  # denied, held for approval, a dry run
    assert held_by({"target": {"cluster": "default"}, "resources": unheld}) is None
    assert held_by({"target": {"cluster": "default"}, "resources": {**res, "pool": None}}) is None
    assert held_by({"target": {}, "resources": res}) is None
    assert held_by(None) is None  # an older record keeps no input
    odd = {**res, "requested": {"guests": True, "cores": "2", "memory_mib": 512, "other": 1}}
    assert held_by({"target": {"cluster": "default"}, "resources": odd}) == ("default", "sandbox", {"memory_mib": 512})


def test_a_decision_record_edited_into_other_shapes_shows_no_hold() -> None:
    """A record edited outside the gateway (valid JSON, fields of other types) restores nothing and
    breaks nothing: the start does not depend on it."""
    from gateway.store.reconcile import held_by

    res = {"requested": one(), "pool": "sandbox", "pool_in_flight": one(0, 0)}
    for doc in (
        {"target": "default", "resources": res},
        {"target": {"cluster": 7}, "resources": res},
        {"resources": "x"},
    ):
        assert held_by(doc) is None, doc
    assert held_by("not a record") is None  # type: ignore[arg-type]


async def test_restored_holds_are_given_back_once_their_calls_are_no_longer_open(tmp_path: Path) -> None:
    """A call an earlier run left open, settled by hand (`pvegate audit reconcile` beside the gateway),
    is no longer in the gateway's next pass over earlier runs: its restored hold is given back then."""
    from types import SimpleNamespace

    from gateway.store.reconcile import Reconciler, Settled

    given: list[str] = []

    async def give_back(request_id: str) -> None:
        given.append(request_id)

    outcomes = SimpleNamespace(on_settled=give_back, audit=SimpleNamespace(path=tmp_path / "no-audit.db"))
    r = Reconciler(None, None, outcomes, {})  # type: ignore[arg-type]
    # an audit that cannot be read restores nothing and does not stop the start (logged)
    assert await r.read_earlier(1e9, MemoryHolds()) == 0
    r.restored = {"still-running", "settled-by-hand", "settled-now"}
    await r.forget_restored([Settled("still-running", "vm_create", "open"), Settled("settled-now", None, "reconciled")])
    assert sorted(given) == ["settled-by-hand", "settled-now"] and r.restored == {"still-running"}
