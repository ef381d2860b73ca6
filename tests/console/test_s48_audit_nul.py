"""The console's audit page and export took a NUL in a filter to the audit search: on PostgreSQL, whose
text holds no NUL, the search failed as if the store had (found by the admin API hunt of stop 48 for
/admin/audit/records, which answered 503 and told health); on SQLite it matched nothing and showed an empty
page, which reads as "nothing happened". Both refuse it now with a 400 naming the filter."""

from __future__ import annotations

import pytest

from gateway.dev.devenv import DevEnv
from tests.console.conftest import Browser, Browsers, human
from tests.support import GatewayThread

ERIN = human("erin", ["auditor"], [])  # every section


@pytest.fixture
def erin(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(cenv, ERIN)


@pytest.mark.parametrize("path", ["/admin/audit", "/admin/audit/export"])
@pytest.mark.parametrize("name", ["principal", "tool", "request_id"])
def test_a_nul_in_an_audit_filter_is_refused(erin: Browser, path: str, name: str) -> None:
    r = erin.get(path, params={name: "a\x00b"})
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert f"{name} must not contain a NUL character" in r.text
