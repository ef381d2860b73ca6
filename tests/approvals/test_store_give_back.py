"""The approval store's give-back and supersession, on both backends (a SQLite file and a real
PostgreSQL, as tests/store does): the statements the gateway tests above exercise on SQLite only."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.store.approvals import POLICY_CHANGE, ApprovalStore, target_key, token_hash
from gateway.store.audit import AuditLog
from gateway.store.db import Database
from tests.store.conftest import backend, make_database  # noqa: F401 - the fixtures, both backends
from tests.store.test_stores import DIGEST, TARGET, approved, person, request

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def store(make_database: Callable[[], Database]) -> AsyncIterator[ApprovalStore]:  # noqa: F811
    s = ApprovalStore(make_database())
    await s.open()
    yield s
    await s.close()


async def _consume(store: ApprovalStore, token: str, used_by: str) -> str | None:
    req, why = await store.consume(
        token_hash(token), "token_hash", "agent", "vm_shutdown", DIGEST, target_key(TARGET), used_by
    )
    return why if req is None else None


async def test_only_the_request_holding_an_approval_gives_it_back(store: ApprovalStore) -> None:
    aid, token = await approved(store)
    assert await _consume(store, token, "req-1") is None
    assert "already used by request req-1" in str(await _consume(store, token, "req-2"))
    assert not await store.release(aid, "req-2")  # not the holder: nothing changes
    assert (await store.get(aid)).state == "used"
    assert await store.release(aid, "req-1")
    back = await store.get(aid)
    assert (back.state, back.used_at, back.used_by_request) == ("approved", None, None)
    assert not await store.release(aid, "req-1")  # once
    assert await _consume(store, token, "req-3") is None  # usable again, and once more only once
    assert "already used by request req-3" in str(await _consume(store, token, "req-4"))


async def test_a_withdrawal_while_a_call_holds_the_approval_is_not_undone_by_its_give_back(
    store: ApprovalStore,
) -> None:
    """An operator withdraws an approval while a call holds it (between redeem and the decision):
    too late to stop that call, but if the call is refused and gives the approval back, it must end
    withdrawn, not be usable again (found by a review: the retry ran the shutdown)."""
    aid, token = await approved(store)
    assert await _consume(store, token, "req-1") is None
    late = await store.withdraw(aid, "operator", "changed my mind")
    assert not late.ok and late.state == "used"
    assert "in use by request req-1" in late.reasons[0] and "ends withdrawn" in late.reasons[0]
    again = await store.withdraw(aid, "operator", None)  # asked twice: still a refusal, said so
    assert not again.ok and "already asked for" in again.reasons[0]
    assert await store.release(aid, "req-1") == "withdrawn"
    ended = await store.get(aid)
    assert ended.state == "withdrawn"
    assert "withdrawn while request req-1 held it" in str(await _consume(store, token, "req-2"))
    assert await store.release(aid, "req-1") is None  # once
    assert await store.expire_due() == []  # not expired over it either


async def test_a_call_that_runs_keeps_the_approval_used_after_a_late_withdrawal(store: ApprovalStore) -> None:
    aid, token = await approved(store)
    assert await _consume(store, token, "req-1") is None
    assert not (await store.withdraw(aid, "operator", None)).ok
    assert (await store.get(aid)).state == "used"  # the call was sent: it used the approval
    assert "already used by request req-1" in str(await _consume(store, token, "req-2"))
    assert await store.release(aid, "req-2") is None


async def test_a_pending_request_on_other_terms_is_superseded(store: ApprovalStore) -> None:
    old, created, gone = await store.find_or_replace(request(min_approvals=2))
    assert created and not gone
    same, created, gone = await store.find_or_replace(request(min_approvals=2))  # the same terms: reused
    assert same.id == old.id and not created and not gone
    half = await store.vote(old.id, person("alice"), "approve", None, None, ["sre-leads"])
    assert half.ok and half.state == "pending"

    other_terms = replace(request(min_approvals=2), approver_groups=["ops-approvers"])
    new, created, gone = await store.find_or_replace(other_terms)
    assert created and new.id != old.id and [g for g, _ in gone] == [old.id]
    ended = await store.get(old.id)
    assert ended.state == "expired" and ended.decided_by == POLICY_CHANGE
    assert ended.note == gone[0][1] and f"superseded by {new.id}" in ended.note
    late = await store.vote(old.id, person("bob"), "approve", None, None, ["sre-leads"])
    assert not late.ok and late.state == "expired"

    shorter = replace(request(min_approvals=2), approver_groups=["ops-approvers"], ttl_seconds=30)  # a lifetime too
    newer, created, gone = await store.find_or_replace(shorter)
    assert created and [g for g, _ in gone] == [new.id] and (await store.get(new.id)).state == "expired"
    assert (await store.get(newer.id)).state == "pending"


async def test_a_token_of_the_wrong_length_is_called_what_it_is(store: ApprovalStore) -> None:
    """A string is not what is wrong with `abc.def.ghi`: it is no token the gateway gives (found by a review)."""
    from gateway.core.principal import Principal
    from gateway.store.approvals import APPROVAL_META_KEY, Approvals

    approvals = Approvals(store)
    principal = Principal(sub="agent", iss="test", roles=(), groups=(), scopes=(), client_id=None, kind="agent")
    facts, why = await approvals.redeem({APPROVAL_META_KEY: "abc.def.ghi"}, principal, "vm_shutdown", DIGEST, TARGET)
    assert facts is None and why is not None
    assert "16 to 256 characters" in why and "expected a string" not in why


async def test_expiries_and_votes_without_their_record_are_listed(
    store: ApprovalStore,
    backend: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The sweep's catch-up queries (Approvals.expire_due) on both backends: the audit's table is in the
    approvals' database, and nothing has been recorded here."""
    if backend == "sqlite":  # the audit's tables in the same file, as a gateway has them
        audit = AuditLog(tmp_path / "store.db")
        await audit.open()
        await audit.close()
    aid, _ = await approved(store)
    gone, _ = await store.find_or_create(request(expires_in=1, digest="sha256:" + "2" * 64))
    await asyncio.sleep(1.2)
    assert await store.expire_due() == [gone.id]
    assert await store.unrecorded_expiries(0) == [gone.id]
    assert [(v["request_id"], v["approver"], v["verdict"]) for v in await store.unrecorded_votes(0)] == [
        (aid, "alice", "approve")
    ]
