"""GET /admin/audit/records: a `limit` above the 5000-record page, or one that is not plain digits (`1_000`,
`+5`, ` 7`), was taken silently: a page of 5000 records with nothing saying more were left out (the page has no
`more` flag) read as "this is everything". A window whose `until` is not after its `since` matched nothing and
read as "nothing happened". Each is a 400 now, as GET /admin/approvals refuses a limit out of its range.
Real gateway, real OPA, real simulator."""

from __future__ import annotations

from tests.approvals.conftest import Api


async def test_audit_records_limit_over_the_page_or_not_digits_is_refused(api: Api) -> None:
    for value in ("5001", "100000", "1_000", "+5", " 7", "٣"):
        r = await api.admin("GET", f"/admin/audit/records?limit={value}", api.admin_token)
        assert r.status_code == 400 and r.json()["error"] == "invalid_request", (value, r.text)
        assert "5000" in r.json()["detail"], r.text
    r = await api.admin("GET", "/admin/audit/records?since=200&until=100", api.admin_token)
    assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
    for query in ("limit=5000", "limit=1", "since=0&until=4102444800&limit=2"):
        r = await api.admin("GET", f"/admin/audit/records?{query}", api.admin_token)
        assert r.status_code == 200, (query, r.text)
