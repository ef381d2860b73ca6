"""The approvers' queue pages through every request of a state, and a read needs a credential first.

- Regression: GET /admin/approvals showed the 200 newest requests of a state with no paging, and
  the console's "open" view took the 300 newest rows of every state before keeping the open ones:
  one agent making a few hundred held calls pushed another requester's live request out of every
  list view, so it expired unseen. The state filter is now SQL's, pending requests come first
  (the one expiring soonest first) and a cursor pages through the rest.
- Regression: GET /admin/approvals/{id} swept expiries and looked the id up before it checked any
  credential: an unauthenticated caller told existing ids from unknown ones (401 vs 404), and each
  such request wrote to the database.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from gateway.dev.devenv import DevEnv
from gateway.store.approvals import ApprovalRequest, ApprovalStore, target_key
from gateway.store.db import database
from tests.approvals.conftest import Api

TARGET = {"cluster": "default", "node": "pve1", "vmid": 100, "type": "qemu", "name": "web1", "tags": ["prod"]}


def held(requester: str, n: int, ttl: int = 900) -> ApprovalRequest:
    """A held call; distinct `n` are distinct calls (distinct arguments), so distinct requests."""
    now = time.time()
    return ApprovalRequest(
        id="apr-" + uuid.uuid4().hex,
        created_at=now,
        request_id=uuid.uuid4().hex,
        requester=requester,
        requester_facts={},
        tool="vm_shutdown",
        tool_facts={},
        arguments_digest=f"sha256:{n:064x}",
        arguments={"vmid": 100, "timeout": n},
        target_key=target_key(TARGET),
        target=TARGET,
        risk={"level": "critical", "score": 90},
        reason="test",
        approver_groups=["sre-leads"],
        min_approvals=1,
        ttl_seconds=ttl,  # the store sets expires_at = its clock + ttl
        expires_at=now + ttl,
        state="pending",
    )


async def flood(store: ApprovalStore, n: int, requester: str = "noisy-agent") -> list[str]:
    ids = []
    for i in range(1, n + 1):
        req, created = await store.find_or_create(held(requester, i))
        assert created
        ids.append(req.id)
    return ids


async def gateway_store(env: DevEnv) -> ApprovalStore:
    """A second connection to the running gateway's approvals database (as another process would)."""
    s = ApprovalStore(database(env.config))
    await s.open()
    return s


async def test_the_operator_api_pages_through_the_whole_queue(api: Api) -> None:
    s = await gateway_store(api.env)
    mine: list[str] = []
    try:
        victim, _ = await s.find_or_create(held("victim-agent", 0))
        mine = [victim.id, *await flood(s, 250)]

        r = await api.admin("GET", "/admin/approvals", api.admin_token)
        assert r.status_code == 200, r.text
        doc = r.json()
        ids = [a["id"] for a in doc["approvals"]]
        assert victim.id in ids and len(ids) == 200  # the default page size, as before
        assert doc["more"] is True and doc["next_cursor"]

        seen: list[str] = []
        cursor: str | None = None
        while True:
            q = "/admin/approvals?state=pending&limit=120" + (f"&cursor={cursor}" if cursor else "")
            r = await api.admin("GET", q, api.admin_token)
            assert r.status_code == 200, r.text
            doc = r.json()
            assert len(doc["approvals"]) <= 120 and all(a["state"] == "pending" for a in doc["approvals"])
            seen += [a["id"] for a in doc["approvals"]]
            cursor = doc["next_cursor"]
            assert doc["more"] is (cursor is not None)
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) and set(mine) <= set(seen)

        for bad in ("limit=0", "limit=501", "limit=ten", "cursor=not-a-cursor"):
            r = await api.admin("GET", f"/admin/approvals?{bad}", api.admin_token)
            assert r.status_code == 400 and r.json()["error"] in ("invalid_request", "bad_cursor"), (bad, r.text)
    finally:
        for aid in mine:  # out of the other tests' queue
            await s.withdraw(aid, "operator", "test cleanup")
        await s.close()


async def _table(s: ApprovalStore) -> list[dict[str, Any]]:
    return await s.database.fetch("SELECT * FROM approval_requests ORDER BY id")


async def test_reading_one_request_authenticates_before_the_store_is_touched(api: Api) -> None:
    s = await gateway_store(api.env)
    try:
        due, _ = await s.find_or_create(held("victim-agent", 10**6, ttl=-5))  # past its expiry, not yet swept
        unknown = "apr-" + uuid.uuid4().hex
        before = await _table(s)

        for token in (None, "not-a-credential"):  # no credential, a bad one: an existing id looks unknown
            answers = []
            for aid in (due.id, unknown):
                r = await api.admin("GET", f"/admin/approvals/{aid}", token)
                answers.append((r.status_code, r.json()))
            assert answers[0] == answers[1] and answers[0][0] == 401, answers

        # the credential-free approval page reads only: it shows the expiry, it does not write it
        async with api.client() as http:
            page = await http.get(f"{api.base}/admin/approvals/{due.id}", headers={"Accept": "text/html"})
        assert page.status_code == 200 and "<b>expired</b>" in page.text
        assert await _table(s) == before  # nothing was written: the due request is still unswept
        assert (await s.get(due.id)).state == "pending"

        # with a credential: the sweep, then the lookup
        r = await api.admin("GET", f"/admin/approvals/{due.id}", api.admin_token)
        assert r.status_code == 200 and r.json()["state"] == "expired"
        r = await api.admin("GET", f"/admin/approvals/{unknown}", api.admin_token)
        assert r.status_code == 404 and r.json()["error"] == "not_found"
    finally:
        await s.close()
