"""One token per request on the admin API too (RFC 6750 §2): with the Authorization header twice, the
first copy was checked and the second left to whoever reads the last one (an intermediary)."""

from __future__ import annotations

import httpx

from tests.approvals.conftest import Api


async def _twice(api: Api, method: str, path: str, first: str, second: str) -> httpx.Response:
    headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
    async with api.client() as http:
        return await http.request(method, api.base + path, headers=headers, json={"note": "test"})


async def test_an_admin_token_sent_twice_is_refused(api: Api) -> None:
    rogue = api.agent("rogue-agent")
    for first, second in ((api.admin_token, rogue), (rogue, api.admin_token), (api.admin_token, api.admin_token)):
        r = await _twice(api, "GET", "/admin/approvals?state=all", first, second)
        assert r.status_code == 401, r.text
        assert r.json()["error"] == "invalid_request" and "more than once" in r.json()["detail"]
    assert (await api.admin("GET", "/admin/approvals?state=all", api.admin_token)).status_code == 200


async def test_an_approver_token_sent_twice_is_refused(api: Api) -> None:
    alice = api.human("alice", ["sre-leads"], ["approver"])
    r = await _twice(api, "POST", "/admin/approvals/0123456789abcdef/approve", alice, api.agent("rogue-agent"))
    assert r.status_code == 401, r.text
    assert r.json()["error"] == "invalid_request"
    # one copy: past authentication (the request id is unknown)
    r = await api.vote("0123456789abcdef", alice)
    assert r.status_code != 401, r.text
