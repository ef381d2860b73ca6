"""The stores replicas share, on both backends: approvals (votes, expiry, one-time redemption) and quotas.

Each test runs on SQLite and on a real PostgreSQL (tests/store/conftest.py); "two replicas"
are two separate Database objects (two pools, or two connections to one SQLite file).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.core.config import ConfigError, SecretRef
from gateway.core.principal import Principal
from gateway.store.approvals import ApprovalRequest, ApprovalStore, target_key, token_hash
from gateway.store.db import Database
from gateway.store.handoffs import SharedStates
from gateway.store.shared_keys import configured_key, shared_key
from gateway.store.usage import SqlQuotas

TARGET = {"cluster": "default", "node": "pve1", "vmid": 100}
DIGEST = "sha256:" + "1" * 64


def person(sub: str) -> Principal:
    return Principal(sub, "test", (), ("sre-leads",), (), None, "human")


def request(min_approvals: int = 1, expires_in: float = 60, digest: str = DIGEST) -> ApprovalRequest:
    now = time.time()
    return ApprovalRequest(
        id="apr-" + uuid.uuid4().hex,
        created_at=now,
        request_id=uuid.uuid4().hex,
        requester="agent",
        requester_facts={},
        tool="vm_shutdown",
        tool_facts={},
        arguments_digest=digest,
        arguments={"vmid": 100},
        target_key=target_key(TARGET),
        target=TARGET,
        risk={},
        reason="test",
        approver_groups=["sre-leads"],
        min_approvals=min_approvals,
        ttl_seconds=int(expires_in),  # the store sets expires_at = created_at + ttl on its clock
        expires_at=now + expires_in,
        state="pending",
    )


@pytest.fixture
async def two(make_database: Callable[[], Database]) -> AsyncIterator[tuple[ApprovalStore, ApprovalStore]]:
    """Two approval stores on one database: two replicas."""
    a, b = ApprovalStore(make_database()), ApprovalStore(make_database())
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)  # SQLite runs the two one after the other
async def test_a_sweep_never_expires_an_approval_granted_while_it_waited(make_database: Callable[[], Database]) -> None:
    """Replica A's vote holds the request's row (granted just before the deadline) while replica B's
    expiry sweep, which saw the request still pending and due, waits for that row; PostgreSQL then
    re-reads the row for B's UPDATE. The fresh approval must stay approved and usable."""
    a, b = ApprovalStore(make_database()), ApprovalStore(make_database())
    await a.open()
    await b.open()
    try:
        req, _ = await a.find_or_create(request(expires_in=1.5))
        token = "t" * 43
        async with a.database.transaction() as tx:  # the vote's transaction, as store.vote takes it
            now = await tx.now()
            rows = await tx.fetch("SELECT expires_at FROM approval_requests WHERE id = ? FOR UPDATE", req.id)
            assert float(rows[0]["expires_at"]) > now  # not yet due: the vote counts
            await asyncio.sleep(1.7)  # the deadline passes; B's sweep starts
            sweep = asyncio.create_task(b.expire_due())
            await asyncio.sleep(0.5)  # B saw it pending and due; its UPDATE waits for this row
            await tx.execute(
                "UPDATE approval_requests SET state = 'approved', decided_at = ?, token_hash = ?, "
                "token_expires_at = ? WHERE id = ?",
                now,
                token_hash(token),
                now + 900,
                req.id,
            )
        assert await sweep == []
        assert (await a.get(req.id)).state == "approved"
        used, why = await b.consume(
            token_hash(token), "token_hash", "agent", "vm_shutdown", DIGEST, target_key(TARGET), "req-x"
        )
        assert used is not None and used.id == req.id, why
    finally:
        await a.close()
        await b.close()


async def approved(store: ApprovalStore) -> tuple[str, str]:
    req, created = await store.find_or_create(request())
    assert created
    out = await store.vote(req.id, person("alice"), "approve", None, None, ["sre-leads"])
    assert out.ok and out.state == "approved" and out.token
    return req.id, out.token


async def consume(store: ApprovalStore, token: str, used_by: str) -> tuple[ApprovalRequest | None, str | None]:
    return await store.consume(
        token_hash(token), "token_hash", "agent", "vm_shutdown", DIGEST, target_key(TARGET), used_by
    )


async def test_a_token_is_redeemed_exactly_once_under_50_concurrent_attempts_on_two_replicas(
    two: tuple[ApprovalStore, ApprovalStore],
) -> None:
    a, b = two
    rid, token = await approved(a)
    results = await asyncio.gather(*(consume((a, b)[i % 2], token, f"call-{i}") for i in range(50)))
    used = [req for req, _ in results if req is not None]
    refusals = [why for req, why in results if req is None]
    assert len(used) == 1 and used[0].id == rid
    assert len(refusals) == 49 and all(w and "already used" in w for w in refusals), refusals[:3]
    final = await b.get(rid)
    assert final.state == "used" and final.used_by_request in {f"call-{i}" for i in range(50)}


async def test_a_token_binds_the_call(two: tuple[ApprovalStore, ApprovalStore]) -> None:
    a, b = two
    _, token = await approved(a)
    tkey, other_digest = target_key(TARGET), "sha256:" + "2" * 64
    req, why = await b.consume(token_hash(token), "token_hash", "agent", "vm_shutdown", other_digest, tkey, "x")
    assert req is None and why and "other arguments" in why
    req, why = await b.consume(
        token_hash(token), "token_hash", "mallory", "vm_shutdown", DIGEST, target_key(TARGET), "x"
    )
    assert req is None and why and "another principal" in why
    req, why = await consume(b, "not-a-token-ever-issued", "x")
    assert req is None and why and "not known" in why
    assert (await consume(b, token, "ok"))[0] is not None  # still unused after the refusals above


async def test_votes_count_once_per_approver_and_a_deny_ends_the_request(
    two: tuple[ApprovalStore, ApprovalStore],
) -> None:
    a, b = two
    req, _ = await a.find_or_create(request(min_approvals=2))
    first = await a.vote(req.id, person("alice"), "approve", "d1", None, ["sre-leads"])
    assert first.ok and first.state == "pending" and first.token is None and (first.approvals, first.needed) == (1, 2)
    again = await b.vote(req.id, person("alice"), "approve", "d2", None, ["sre-leads"])
    assert not again.ok and "already voted" in again.reasons[0]
    second = await b.vote(req.id, person("bob"), "approve", "d3", "ok", ["sre-leads"])
    assert second.ok and second.state == "approved" and second.token and second.approvals == 2
    late = await a.vote(req.id, person("carol"), "approve", "d4", None, ["sre-leads"])
    assert not late.ok and "is approved" in late.reasons[0]
    stored = await a.get(req.id)
    assert [v["approver"] for v in stored.approvals] == ["alice", "bob"]

    other, _ = await a.find_or_create(request(min_approvals=2, digest="sha256:" + "3" * 64))
    denied = await b.vote(other.id, person("dave"), "deny", "d5", "no", ["sre-leads"])
    assert denied.ok and denied.state == "denied" and denied.token is None
    assert (await a.get(other.id)).state == "denied"


async def test_concurrent_approvals_on_two_replicas_mint_exactly_one_token(
    two: tuple[ApprovalStore, ApprovalStore],
) -> None:
    """min_approvals 2, six approvers voting at once on two replicas: the request completes once."""
    a, b = two
    req, _ = await a.find_or_create(request(min_approvals=2))
    outs = await asyncio.gather(
        *((a, b)[i % 2].vote(req.id, person(f"approver-{i}"), "approve", None, None, ["sre-leads"]) for i in range(6))
    )
    tokens = [o.token for o in outs if o.token]
    assert len(tokens) == 1, outs
    assert sum(o.ok for o in outs) == 2  # the rest found the request already approved
    assert (await consume(b, tokens[0], "call"))[0] is not None


async def test_identical_pending_requests_on_two_replicas_are_one(two: tuple[ApprovalStore, ApprovalStore]) -> None:
    a, b = two
    results = await asyncio.gather(*((a, b)[i % 2].find_or_create(request()) for i in range(20)))
    assert len({r.id for r, _ in results}) == 1
    assert sum(created for _, created in results) == 1


async def test_expiry_is_enforced_by_the_store(two: tuple[ApprovalStore, ApprovalStore]) -> None:
    """No sweep runs: the vote and the redemption themselves refuse what has expired."""
    a, b = two
    stale, _ = await a.find_or_create(request(expires_in=-1))
    out = await b.vote(stale.id, person("alice"), "approve", None, None, ["sre-leads"])
    assert not out.ok and out.token is None and "expired" in out.reasons[0]

    rid, token = await approved(a)
    async with a.database.transaction() as tx:  # the token's lifetime ran out
        await tx.execute("UPDATE approval_requests SET token_expires_at = ? WHERE id = ?", time.time() - 1, rid)
    req, why = await consume(b, token, "late")
    assert req is None and why and "expired" in why
    assert set(await b.expire_due()) == {stale.id, rid}
    assert (await a.get(rid)).state == "expired" and (await a.get(stale.id)).state == "expired"


async def test_withdraw(two: tuple[ApprovalStore, ApprovalStore]) -> None:
    a, b = two
    rid, token = await approved(a)
    assert (await b.withdraw(rid, "operator", "changed my mind")).ok
    req, why = await consume(a, token, "after")
    assert req is None and why and "withdrawn" in why
    assert not (await a.withdraw(rid, "operator", None)).ok


# --- quotas ---------------------------------------------------------------------------------


@pytest.fixture
async def quotas(make_database: Callable[[], Database]) -> AsyncIterator[tuple[SqlQuotas, SqlQuotas]]:
    a, b = SqlQuotas(make_database()), SqlQuotas(make_database())
    await a.open()
    await b.open()
    yield a, b
    await a.close()
    await b.close()


async def test_a_limit_of_10_lets_exactly_10_of_30_concurrent_calls_through_two_replicas(
    quotas: tuple[SqlQuotas, SqlQuotas],
) -> None:
    """What the pipeline does: reserve, let the policy (here: count < 10) decide, give back on a deny."""
    a, b = quotas

    async def call(i: int) -> bool:
        store = (a, b)[i % 2]
        counts, slot = await store.reserve("racer", "vm_reboot")
        await asyncio.sleep(0.005)  # the OPA query and the audit write happen here
        if counts["tool"]["1m"] >= 10:
            await store.release("racer", "vm_reboot", slot)
            return False
        return True

    allowed = await asyncio.gather(*(call(i) for i in range(30)))
    assert sum(allowed) == 10
    counts, _ = await a.reserve("racer", "vm_reboot")
    assert counts["tool"] == {"1m": 10, "1h": 10, "24h": 10}  # the 20 denied slots were given back


async def test_each_concurrent_reservation_sees_every_one_before_it(quotas: tuple[SqlQuotas, SqlQuotas]) -> None:
    a, b = quotas
    seen = await asyncio.gather(*((a, b)[i % 2].reserve("agent", "vm_start") for i in range(30)))
    assert sorted(c["tool"]["1m"] for c, _ in seen) == list(range(30))


async def test_counts_per_tool_and_for_all_tools(quotas: tuple[SqlQuotas, SqlQuotas]) -> None:
    a, b = quotas
    await a.reserve("agent", "vm_start")
    _, slot = await b.reserve("agent", "vm_stop")
    await a.reserve("someone-else", "vm_start")
    counts, _ = await b.reserve("agent", "vm_start")
    assert counts == {"tool": {"1m": 1, "1h": 1, "24h": 1}, "all": {"1m": 2, "1h": 2, "24h": 2}}
    await a.release("agent", "vm_stop", slot)
    counts, _ = await a.reserve("agent", "vm_status")
    assert counts["tool"]["24h"] == 0 and counts["all"]["24h"] == 2


async def test_old_reservations_leave_the_windows(quotas: tuple[SqlQuotas, SqlQuotas]) -> None:
    a, _ = quotas
    now = time.time()
    async with a.database.transaction() as tx:
        for age in (30, 120, 7200, 90000):  # in 1m; 1h; 24h; past 24 h (pruned)
            await tx.execute("INSERT INTO usage_events (principal, tool, at) VALUES (?, ?, ?)", "p", "t", now - age)
    counts, _ = await a.reserve("p", "t")
    assert counts["tool"] == {"1m": 1, "1h": 2, "24h": 3}
    rows: list[dict[str, Any]] = await a.database.fetch(
        "SELECT COUNT(*) AS n FROM usage_events WHERE principal = ?", "p"
    )
    assert int(rows[0]["n"]) == 4  # the one past 24 h was deleted, the new one added


async def test_expiry_is_on_the_database_clock(
    two: tuple[ApprovalStore, ApprovalStore], backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose clock runs an hour ahead still agrees with the others on PostgreSQL: every
    created_at, expiry and redemption is on the server's clock. (SQLite: one host, one clock.)"""
    if backend != "postgresql":
        pytest.skip("SQLite replicas share one host's clock")
    a, b = two
    import gateway.store.approvals as approvals_module

    class Ahead:
        @staticmethod
        def time() -> float:
            return time.time() + 3600

    rid, token = await approved(a)
    monkeypatch.setattr(approvals_module, "time", Ahead)  # replica b's clock is skewed
    assert await b.expire_due() == []  # its own clock would expire the fresh token
    req, why = await consume(b, token, "skewed")
    assert why is None and req is not None and req.id == rid
    created, _ = await b.find_or_create(request())  # created now by the server's clock, not an hour ahead
    assert abs(created.created_at - time.time()) < 60 and created.expires_at - created.created_at == 60


async def test_the_shared_key_is_created_once_by_concurrent_first_starts(
    make_database: Callable[[], Database],
) -> None:
    dbs = [make_database() for _ in range(4)]
    for db in dbs:
        await db.open()
    try:
        from gateway.store.migrations import check
        from gateway.store.shared_keys import MIGRATIONS

        await check(dbs[0], "keys", MIGRATIONS)
        keys = await asyncio.gather(*(shared_key(dbs[i % 4]) for i in range(12)))
        assert len(set(keys)) == 1 and len(keys[0]) == 64
        assert await shared_key(dbs[1]) == keys[0]  # and stays that key
    finally:
        for db in dbs:
            await db.close()


def test_a_configured_state_key_is_validated(tmp_path: Any) -> None:
    from dataclasses import replace

    from gateway.core.config import load
    from tests.config.conftest import minimal, write

    cfg = load(write(tmp_path, minimal(tmp_path)))
    assert configured_key(cfg) is None  # not configured: the database holds it
    short, good = tmp_path / "short", tmp_path / "good"
    short.write_text("abc\n")
    good.write_text("a" * 64 + "\n")
    with pytest.raises(ConfigError, match="at least 32"):
        configured_key(replace(cfg, state_key=SecretRef(file=short, setting="state_key")))
    with pytest.raises(ConfigError, match="cannot read secret file"):
        configured_key(replace(cfg, state_key=SecretRef(file=tmp_path / "absent", setting="state_key")))
    assert configured_key(replace(cfg, state_key=SecretRef(file=good, setting="state_key"))) == b"a" * 64


async def test_a_database_restart_is_a_clear_refusal_then_served_again_without_reopening() -> None:
    """While PostgreSQL is down every store call raises DatabaseUnavailable (the pipeline refuses
    the call with it); when it is back the same open pool serves again, no restart needed."""
    from gateway.store.db import DatabaseUnavailable, PostgresDatabase
    from gateway.store.schema import upgrade_all
    from tests.pgserver import start_postgres

    server = start_postgres()
    try:
        db = PostgresDatabase(server.dsn, max_size=4)
        await db.open()
        await upgrade_all(db)
        store, quotas = ApprovalStore(db), SqlQuotas(PostgresDatabase(server.dsn, max_size=4))
        await quotas.open()
        await store.find_or_create(request())
        server.halt()
        for attempt in (store.expire_due(), store.find_or_create(request()), quotas.reserve("p", "vm_start")):
            with pytest.raises(DatabaseUnavailable, match="PostgreSQL cannot be reached"):
                await attempt
        server.resume()
        created, fresh = await store.find_or_create(request(digest="sha256:" + "2" * 64))
        assert fresh and (await store.get(created.id)).state == "pending"
        counts, _slot = await quotas.reserve("p", "vm_start")
        assert counts["tool"]["1m"] == 0
        await quotas.close()
        await db.close()
    finally:
        server.stop()


async def test_every_process_on_one_database_seals_with_the_same_key(tmp_path: Any) -> None:
    """What the gateway does at start (app.py): a request state sealed by one process (replica)
    is accepted by another on the same database; a configured state_key takes precedence."""
    from dataclasses import replace

    from gateway.core.config import load
    from gateway.mcp.request_state import RequestStates, Sealer
    from gateway.store.shared_keys import state_key
    from tests.config.conftest import minimal, write

    cfg = load(write(tmp_path, minimal(tmp_path)))
    first, second = await asyncio.gather(state_key(cfg), state_key(cfg))
    assert first == second == await state_key(cfg)
    agent = person("agent")
    token = RequestStates(Sealer(first)).mint(agent, DIGEST, "apr-1")
    assert (await RequestStates(Sealer(second)).redeem(token, agent, DIGEST)).approval_id == "apr-1"
    keyfile = tmp_path / "state-key"
    keyfile.write_text("k" * 40)
    configured = replace(cfg, state_key=SecretRef(file=keyfile, setting="state_key"))
    assert await state_key(configured) == b"k" * 40 != first


@pytest.fixture
async def shared(make_database: Callable[[], Database]) -> AsyncIterator[tuple[SharedStates, SharedStates]]:
    """The retry state of two replicas on one database."""
    from gateway.store.handoffs import MIGRATIONS
    from gateway.store.migrations import check

    a, b = make_database(), make_database()
    await a.open()
    await b.open()
    await check(a, "handoffs", MIGRATIONS)
    yield SharedStates(a), SharedStates(b)
    await a.close()
    await b.close()


async def test_a_request_state_is_single_use_across_replicas(shared: tuple[SharedStates, SharedStates]) -> None:
    from gateway.mcp.request_state import RequestStates, Sealer, StateError

    a, b = shared
    key = b"k" * 32
    one, two = RequestStates(Sealer(key), shared=a), RequestStates(Sealer(key), shared=b)
    agent = person("agent")
    token = one.mint(agent, DIGEST, "apr-1")
    outcomes = await asyncio.gather(
        *((one, two)[i % 2].redeem(token, agent, DIGEST) for i in range(20)), return_exceptions=True
    )
    redeemed = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, StateError)]
    assert len(redeemed) == 1 and redeemed[0].approval_id == "apr-1", outcomes
    assert len(refused) == 19 and all(str(e).startswith("already used") for e in refused)


async def test_a_request_state_given_back_is_usable_once_more_on_any_replica(
    shared: tuple[SharedStates, SharedStates],
) -> None:
    """A retry refused before sending gives its approval back and its requestState with it
    (RequestStates.give_back): another replica takes it once more, and once only."""
    from gateway.mcp.request_state import RequestStates, Sealer, StateError

    a, b = shared
    key = b"k" * 32
    one, two = RequestStates(Sealer(key), shared=a), RequestStates(Sealer(key), shared=b)
    agent = person("agent")
    token = one.mint(agent, DIGEST, "apr-2")
    state = await one.redeem(token, agent, DIGEST)
    with pytest.raises(StateError, match="already used"):
        await two.redeem(token, agent, DIGEST)
    await one.give_back(state)
    assert (await two.redeem(token, agent, DIGEST)).approval_id == "apr-2"
    with pytest.raises(StateError, match="already used"):
        await one.redeem(token, agent, DIGEST)


async def test_a_console_sign_out_holds_on_every_replica(shared: tuple[SharedStates, SharedStates]) -> None:
    """Signed out on one replica: another refuses the same session; the row goes once it could
    not matter (past the session's longest life)."""
    a, b = shared
    t = time.time()
    assert not await b.signed_out("sid-1", "carol", t)
    await a.sign_out("sid-1", time.time() + 3600)
    await a.sign_out("sid-1", time.time() + 3600)  # twice (a double-click): still one sign-out
    assert await b.signed_out("sid-1", "carol", t) and not await b.signed_out("sid-2", "carol", t)
    await b.sign_out("sid-old", time.time() - 1)  # lapsed: swept by the next sign-out
    await a.sign_out("sid-3", time.time() + 3600)
    assert not await a.signed_out("sid-old", "carol", t) and await a.signed_out("sid-1", "carol", t)


async def test_a_person_signed_out_everywhere_loses_every_session_begun_before(
    shared: tuple[SharedStates, SharedStates],
) -> None:
    """Signing a person out everywhere (on one replica) ends each of their sessions begun until then,
    on every replica; not another person's, and not the ones they begin afterwards."""
    a, b = shared
    earlier, t = time.time() - 600, time.time() - 1
    assert not await b.signed_out("sid-d1", "dave", t)
    before = await a.sign_out_person("dave", 3600)
    assert before >= t
    assert await b.signed_out("sid-d1", "dave", t) and await b.signed_out("sid-d2", "dave", earlier)
    assert not await b.signed_out("sid-e1", "erin", t)  # someone else
    assert not await b.signed_out("sid-d3", "dave", before + 0.5)  # signed in again afterwards
    again = await b.sign_out_person("dave", 3600)  # a second time moves the line forward
    assert again >= before and await a.signed_out("sid-d4", "dave", again)
    assert not await a.signed_out("sid-d5", "dave", again + 1)
    await a.sign_out_person("old", -1)  # lapsed: swept by the next one
    await b.sign_out_person("erin", 3600)
    assert not await a.signed_out("sid-o", "old", earlier)


async def test_a_sign_out_committed_late_never_moves_the_line_back(
    shared: tuple[SharedStates, SharedStates],
) -> None:
    """Two sign-outs of one person (the console and the CLI at once) commit out of order: the one
    that read the earlier time must not put the line back over the later one."""
    a, b = shared
    first = await a.sign_out_person("frank", 3600)
    later = first + 30  # as if another replica's sign-out had read a later time and committed first
    async with a.database.transaction() as tx:
        await tx.execute("UPDATE console_person_signouts SET before = ? WHERE sub = ?", later, "frank")
    await b.sign_out_person("frank", 3600)  # reads a time before `later`
    assert await a.signed_out("sid-f1", "frank", later)  # still refused: the later line stands


async def test_a_legacy_handoff_is_found_by_another_replica_once(shared: tuple[SharedStates, SharedStates]) -> None:
    a, b = shared
    await a.remember("iss\x1fagent", DIGEST, "apr-1", 600)
    assert await b.recall("iss\x1fother", DIGEST) is None  # bound to the principal
    assert await b.recall("iss\x1fagent", DIGEST) == "apr-1"
    assert await a.recall("iss\x1fagent", DIGEST) is None  # single-use
    await b.remember("iss\x1fagent", DIGEST, "apr-2", -1)  # already lapsed
    assert await a.recall("iss\x1fagent", DIGEST) is None


async def test_processes_opening_a_new_sqlite_file_together_all_start(tmp_path: Any) -> None:
    """Two replicas (or a gateway and `pvegate db upgrade`) opening a new file at once: switching
    it to WAL takes the file's exclusive lock and SQLite says "database is locked" without waiting;
    every opener must wait it out, and all agree on the one key."""
    from gateway.core.config import load
    from gateway.store.shared_keys import state_key
    from tests.config.conftest import minimal, write

    for i in range(60):
        cfg = load(write(tmp_path / f"new-{i}", minimal(tmp_path / f"new-{i}")))  # a new database file each
        keys = await asyncio.gather(*(state_key(cfg) for _ in range(4)))  # what each process does at start
        assert len(set(keys)) == 1
