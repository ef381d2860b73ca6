"""GET /admin/audit/records on PostgreSQL: a filter value PostgreSQL cannot hold (a NUL character in
`principal`, `tool`, `outcome`...) is the request's own mistake: a 400 naming it, as on the approval routes.
It was a 503 "store unavailable" that also told the health signal the audit store had failed ("audit write
failed" in the log, the store error the readiness check reports), so an operator's typo read as an outage.
Real gateway on a real PostgreSQL, real OPA, real simulator."""

from __future__ import annotations

from tests.approvals.conftest import Api
from tests.approvals.test_note_controls import pg_api, pg_env  # noqa: F401 - the PostgreSQL gateway's fixtures


async def test_a_nul_in_an_audit_filter_is_a_400_not_a_store_failure(pg_api: Api) -> None:  # noqa: F811
    async with pg_api.client() as http:
        for name in ("principal", "tool", "outcome", "kind", "request_id", "target"):
            for value in ("a\x00b", "a*\x00"):
                r = await http.get(
                    pg_api.base + "/admin/audit/records",
                    params={name: value},
                    headers={"Authorization": f"Bearer {pg_api.admin_token}"},
                )
                assert r.status_code == 400, (name, repr(value), r.status_code, r.text)
                assert r.json()["error"] == "invalid_request" and "Traceback" not in r.text
        health = await http.get(
            pg_api.base + "/admin/health", headers={"Authorization": f"Bearer {pg_api.admin_token}"}
        )
        # the audit store was never told it failed: no store error in the operator's health view
        assert health.status_code == 200 and "0x00" not in health.text, health.text
        ok = await http.get(
            pg_api.base + "/admin/audit/records",
            params={"limit": "1"},
            headers={"Authorization": f"Bearer {pg_api.admin_token}"},
        )
        assert ok.status_code == 200, ok.text
