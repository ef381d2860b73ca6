"""The admin API's JSON bodies are read as the MCP endpoint's are: a member named twice (a vote's `note`,
a `decision` of approve and deny) is refused with 400, not read as its last copy; NaN and 1e400 too."""

from __future__ import annotations

import pytest

from tests.approvals.conftest import Api


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"note": "fine", "note": "rm -rf"}', 'the name "note" appears more than once in one object'),
        (b'{"note": NaN}', "NaN is not a JSON value"),
        (b'{"n": 1e400}', "the number 1e400 is out of range"),
    ],
)
async def test_a_vote_body_json_cannot_hold_unambiguously_is_refused(api: Api, body: bytes, reason: str) -> None:
    alice = api.human("alice", ["sre-leads"], ["approver"])
    async with api.client() as http:
        r = await http.post(
            api.base + "/admin/approvals/0123456789abcdef/approve",
            content=body,
            headers={"Authorization": f"Bearer {alice}", "Content-Type": "application/json"},
        )
    assert r.status_code == 400, r.text
    assert r.json() == {"error": "invalid_request", "detail": f"body must be JSON: {reason}"}


async def test_a_vote_body_with_unique_names_reaches_the_lookup(api: Api) -> None:
    alice = api.human("alice", ["sre-leads"], ["approver"])
    async with api.client() as http:
        r = await http.post(
            api.base + "/admin/approvals/0123456789abcdef/approve",
            content=b'{"note": "fine"}',
            headers={"Authorization": f"Bearer {alice}", "Content-Type": "application/json"},
        )
    assert r.status_code == 404, r.text  # past the body: the request id is unknown
