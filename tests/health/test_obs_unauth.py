"""An unauthenticated request to /metrics or /admin/* while the audit store refuses writes: its
auth_failure row cannot be written, so it is answered as /mcp answers it, 503 with Retry-After and
no internal error (no traceback, no 500), and the health signal learns of the store."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.store.outcomes import RETRY_AFTER_SECONDS
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.support import GatewayThread


async def test_a_refused_scrape_or_admin_request_is_a_503_when_its_row_cannot_be_written(
    hsim: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scrape = tmp_path / "scrape"
    scrape.write_text("scrape-secret-123456\n")
    env = health_env(tmp_path / "gw", hsim, metrics={"token": {"file": str(scrape)}})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
            con = sqlite3.connect(env.config.audit_path, timeout=5)
            (top,) = con.execute("SELECT max(seq) FROM audit").fetchone()
            con.execute(
                "INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                ((top or 0) + 1, time.time(), "x", "decision", "p", "t", None, "allow", "{}", "00", "00"),
            )
            con.commit()
            con.close()
            with caplog.at_level(logging.ERROR):
                for path, headers in (
                    ("/metrics", {}),
                    ("/admin/health", {}),
                    ("/metrics", {"Authorization": "Bearer not-the-scrape-token"}),
                    ("/admin/audit/verify", {"Authorization": "Bearer not-the-admin-token"}),
                ):
                    r = await http.get(base + path, headers=headers)
                    assert r.status_code == 503, (path, r.status_code, r.text[:300])
                    assert r.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
                    assert r.json()["error"] == "audit_unavailable", r.text
                    assert "exists past" not in r.text  # the store's error is not told to this caller
            assert not [rec.getMessage() for rec in caplog.records if rec.exc_info]
            assert gw.components.outcomes.last_store_error is not None  # the health signal learnt of it
            assert "exists past the authenticated head" in gw.components.outcomes.last_store_error
            # the scrape and admin credentials still work as before
            ok = await http.get(base + "/metrics", headers={"Authorization": "Bearer scrape-secret-123456"})
            assert ok.status_code == 200
    finally:
        gw.stop()
