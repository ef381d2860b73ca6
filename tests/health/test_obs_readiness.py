"""Readiness never says ready while every call is refused for the audit store: a row another hand
added past the authenticated head (an integrity failure that refuses every commit) keeps /readyz and
pvegate_ready red on an idle gateway too, and so does anything Outcomes.store_problem refuses calls for."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gateway.core.config import HealthConfig
from gateway.observability.health import HealthMonitor
from gateway.store.audit import AuditRecord
from gateway.store.outcomes import Outcomes
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.resilience.helpers import call
from tests.support import GatewayThread

PAST_HEAD = "exists past the authenticated head"

# what a client is told (the store's own words are in /admin/health and the log; /readyz, which takes no
# credential, names the error's type)
STORE_REFUSES = "the audit store cannot take writes"


def _red_for_the_head(r: Any) -> bool:
    return bool(r.status_code == 503 and "AuditIntegrityError" in (r.json()["checks"]["audit"]["detail"] or ""))


async def test_readiness_stays_red_while_a_row_past_the_head_refuses_every_call(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path / "gw", hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    tok = env.token("agent", ["operator"])
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
            assert (await call(http, base + "/mcp", tok, "list_nodes", {})).status_code == 200
            # a row appears past the authenticated head, beyond a gap (another hand writes the file)
            con = sqlite3.connect(env.config.audit_path, timeout=5)
            (top,) = con.execute("SELECT max(seq) FROM audit").fetchone()
            con.execute(
                "INSERT INTO audit VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (top + 5, time.time(), "x", "decision", "p", "t", None, "allow", "{}", "00", "00"),
            )
            con.commit()
            con.close()
            # idle (no call): the probe alone finds it
            await wait_for(http, base + "/readyz", _red_for_the_head, timeout=5)
            refused = await call(http, base + "/mcp", tok, "list_nodes", {})
            assert refused.status_code == 503 and STORE_REFUSES in refused.text, refused.text[:300]
            token = env.config.admin.token.read()  # type: ignore[union-attr]
            admin = await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {token}"})
            assert admin.status_code == 503 and PAST_HEAD in admin.json()["checks"]["audit"]["detail"], admin.text
            # and it stays red, idle, for many probe intervals (0.5 s), while calls are still refused
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                r = await http.get(base + "/readyz")
                assert _red_for_the_head(r), r.text[:600]
                await asyncio.sleep(0.1)
            m = await http.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
            assert "pvegate_ready 0.0" in m.text
            refused = await call(http, base + "/mcp", tok, "list_nodes", {})
            assert refused.status_code == 503 and STORE_REFUSES in refused.text, refused.text[:300]
        c = gw.components
        assert c.health is not None and c.health.outcomes is c.outcomes  # readiness asks what refuses calls
    finally:
        gw.stop()


def _monitor(outcomes: Outcomes | None, audit: Any) -> HealthMonitor:
    monitor = HealthMonitor(HealthConfig(), SimpleNamespace(data_check=None), audit, SimpleNamespace())  # type: ignore[arg-type]
    monitor.opa_ok_at, monitor.opa_error, monitor.revision = time.monotonic(), None, "files:0123456789ab"
    monitor.outcomes = outcomes
    return monitor


def test_the_audit_check_is_red_while_calls_are_refused_for_the_store() -> None:
    """Records waiting in the outbox refuse every call (Outcomes.store_problem) though the last commit
    worked: readiness is red for as long, with the same reason, and green again once they are written."""
    audit = SimpleNamespace(last_commit_at=time.monotonic(), last_error=None, local_dir=None)
    outcomes = Outcomes(audit, grace_seconds=1, min_free_bytes=0)  # type: ignore[arg-type]
    monitor = _monitor(outcomes, audit)
    assert monitor.checks()["audit"]["ok"], monitor.checks()["audit"]
    outcomes.outbox.append(AuditRecord("r1", "result", "agent", "list_nodes", None, "ok", {}))
    assert outcomes.store_problem() is not None
    audit_check = monitor.checks()["audit"]
    assert not audit_check["ok"]
    assert "1 audit record(s) are still waiting to be written" in audit_check["detail"]
    ready, doc = monitor.readiness()
    assert not ready and any("still waiting to be written" in r for r in doc["reasons"])
    outcomes.outbox.clear()
    outcomes.store_failed(RuntimeError("disk I/O error"))  # a write failed moments ago: calls refused too
    assert "the last audit write failed (disk I/O error)" in monitor.checks(private=True)["audit"]["detail"]
    # the store's text is for /admin/health: /readyz (no credential) says the same in the gateway's words
    public = monitor.checks()["audit"]
    assert not public["ok"] and "disk I/O error" not in public["detail"], public
    assert public["detail"] == "calls are refused: the last audit write failed (details in /admin/health)"
