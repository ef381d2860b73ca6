"""The console's audit search and export answer a filter that can match nothing with a 400 naming it, as
the admin API's GET /admin/audit/records does: a time that is no finite number (nan, inf, 1e400) and a
kind or outcome the audit never writes used to give an empty page that reads as "nothing happened".
Real gateway, real OPA, real simulator."""

from __future__ import annotations

import html

import pytest

from gateway.dev.devenv import DevEnv
from tests.console.conftest import Browser, Browsers, human
from tests.support import GatewayThread

FAY = human("fay", ["auditor"], [])  # her own audit_search/audit_export records: other tests read carol's


@pytest.fixture
def fay(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(cenv, FAY)


@pytest.mark.parametrize("page", ["/admin/audit", "/admin/audit/export"])
def test_a_time_that_is_no_finite_number_is_refused(fay: Browser, page: str) -> None:
    for field in ("since", "until"):
        for value in ("nan", "NaN", "inf", "-inf", "1e400"):
            r = fay.get(page, params={field: value})
            assert r.status_code == 400, (field, value, r.status_code)
            assert "is not a time" in html.unescape(r.text), r.text[:300]
    assert fay.get(page, params={"since": "0", "until": "1e12"}).status_code == 200


@pytest.mark.parametrize("page", ["/admin/audit", "/admin/audit/export"])
def test_a_kind_or_outcome_the_audit_never_writes_is_refused(fay: Browser, page: str) -> None:
    r = fay.get(page, params={"kind": "decisoin"})
    assert r.status_code == 400 and "kind must be one of" in html.unescape(r.text), r.text[:300]
    r = fay.get(page, params={"outcome": "alow"})
    assert r.status_code == 400 and "outcome must be an outcome the audit writes" in html.unescape(r.text)
    # what the audit writes, and globs, are filters like before
    for params in ({"kind": "decision"}, {"kind": "deci*"}, {"outcome": "pending"}):
        assert fay.get(page, params=params).status_code == 200, params
