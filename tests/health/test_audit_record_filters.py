"""GET /admin/audit/records: a filter that can match nothing is a 400, not an empty page.

An empty page reads as "nothing happened": a mistyped `outcome=denied` (the decision's outcome is
`deny`) or `since=1e400` (inf: after every record) would hide every record it was meant to find.
A live gateway (real OPA, the simulator), as the operator's requests reach it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.health.conftest import base_url, health_env, http_client
from tests.support import GatewayThread


async def test_bad_filters_are_refused_and_good_ones_answer(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    try:
        admin = {"Authorization": f"Bearer {env.config.admin.token.read()}"}  # type: ignore[union-attr]
        url = base_url(env.config) + "/admin/audit/records"
        async with http_client(env) as http:
            for query in ("since=nan", "since=inf", "since=-inf&limit=1", "since=1e400", "until=nan"):
                r = await http.get(f"{url}?{query}", headers=admin)
                assert r.status_code == 400, (query, r.text)
                assert r.json()["error"] == "invalid_request" and "finite" in r.json()["detail"], query
            for query, column in (("outcome=zzz", "outcome"), ("kind=zzz", "kind"), ("kind=zz*", "kind")):
                r = await http.get(f"{url}?{query}", headers=admin)
                assert r.status_code == 400, (query, r.text)
                assert r.json()["error"] == "bad_filter" and r.json()["detail"].startswith(f"{column} must be")
            # known values (and globs of them) that match nothing yet are an empty page, not an error
            for query in ("outcome=consumed", "kind=approval", "kind=appr*", "outcome=*_refused", "since=0"):
                r = await http.get(f"{url}?{query}&until=1", headers=admin)
                assert r.status_code == 200 and r.json() == {"records": []}, (query, r.text)
            r = await http.get(f"{url}?since=0&limit=5", headers=admin)
            assert r.status_code == 200, r.text
    finally:
        gw.stop()
