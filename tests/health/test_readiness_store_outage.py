"""Readiness follows a PostgreSQL outage as calls meet it, not one audit probe interval later.

While PostgreSQL is down a call is refused in its first store step (the quota reservation), before any
audit commit: nothing the audit probe sees. The refusal turns /readyz red at once, and it stays red
(past Outcomes' short hold) until something commits again. When PostgreSQL is back, the first call that
commits turns it green at once, though the last audit probe (run during the outage) failed.

The probe interval is a minute here: only the call path can turn readiness either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx

from gateway.core.config import HealthConfig
from gateway.observability.health import HealthMonitor
from gateway.store.audit_seal import HeadKey
from gateway.store.db import DatabaseUnavailable, PostgresDatabase
from gateway.store.outcomes import Outcomes
from gateway.store.schema import upgrade_all
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.pgserver import start_postgres
from tests.resilience.helpers import call
from tests.store.auditstore import sign_new_chain
from tests.support import GatewayThread

PROBE_INTERVAL = 60.0
PROMPT = 1.0  # seconds readiness may take to follow what a call met


def _code(r: httpx.Response) -> Any:
    try:
        return (r.json().get("error") or {}).get("code")
    except ValueError:
        return None


async def test_readyz_follows_a_postgresql_outage_that_calls_meet_in_both_directions(hsim: Any, tmp_path: Path) -> None:
    server = start_postgres()  # its own server: this test stops it
    try:
        url = await server.create_database()
        db = PostgresDatabase(url)
        await db.open()
        await upgrade_all(db)
        await db.close()
        env = health_env(
            tmp_path / "gw",
            hsim,
            storage={"url": url, "pool_max_size": 4},
            health={"audit_probe_interval": PROBE_INTERVAL, "audit_probe_timeout": 5},
        )
        env.config.audit_key_path.parent.mkdir(parents=True, exist_ok=True)
        HeadKey.create(env.config.audit_key_path)
        await sign_new_chain(url, env.config.audit_key_path)
        gw = GatewayThread(env.config).start()
        base = base_url(env.config)
        tok = env.token("agent", ["operator"])
        try:
            async with http_client(env) as http:
                await wait_for(http, base + "/readyz", lambda r: r.status_code == 200, timeout=20)
                assert (await call(http, base + "/mcp", tok, "list_nodes", {})).status_code == 200

                server.halt()
                refused = await call(http, base + "/mcp", tok, "list_nodes", {})
                assert refused.status_code == 503 and _code(refused) == -32010, refused.text[:400]
                refused_at = time.monotonic()
                r, _ = await wait_for(http, base + "/readyz", lambda r: r.status_code == 503, timeout=PROMPT)
                assert "audit" in r.json()["checks"] and not r.json()["checks"]["audit"]["ok"], r.text[:600]
                # and red it stays, with no call and no probe, past Outcomes' hold (2 s) on the failure
                while time.monotonic() - refused_at < 4:
                    r = await http.get(base + "/readyz")
                    assert r.status_code == 503, f"green {time.monotonic() - refused_at:.1f} s after: {r.text[:600]}"
                    await asyncio.sleep(0.2)
                detail = r.json()["checks"]["audit"]["detail"]
                assert "PostgreSQL" not in detail and "127.0.0.1" not in detail, detail  # the public view

                # an audit write fails meanwhile, and the periodic audit probe runs (as it does once the last
                # commit is older than its interval) and fails too
                health = gw.components.health
                assert health is not None and gw.loop is not None

                async def probe_during_the_outage() -> None:
                    with contextlib.suppress(Exception):
                        await health.audit.probe()
                    await health.probe_audit()

                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(probe_during_the_outage(), gw.loop))
                assert health.audit_probe_error is not None

                server.resume()
                deadline = time.monotonic() + 30
                while True:  # refused for a moment more (Outcomes' hold, the pool reconnecting), then served
                    served = await call(http, base + "/mcp", tok, "list_nodes", {})
                    if served.status_code == 200 and _code(served) is None:
                        break
                    assert served.status_code == 503 and _code(served) == -32010, served.text[:400]
                    assert time.monotonic() < deadline, served.text[:400]
                    await asyncio.sleep(0.3)
                r, _ = await wait_for(http, base + "/readyz", lambda r: r.status_code == 200, timeout=PROMPT)
                assert r.json()["checks"]["audit"]["ok"], r.text[:600]
        finally:
            gw.stop()
    finally:
        server.stop()


def test_a_refusal_holds_readiness_red_until_a_commit_and_a_commit_clears_a_refused_probe() -> None:
    """The rules on their own: a call refused for the store is red past Outcomes' hold until something commits;
    a probe the store refused is cleared by a commit after it, a timed-out one (whose own write may still
    commit, late) only by the next probe."""
    audit = SimpleNamespace(last_commit_at=time.monotonic() - 10, last_error=None, local_dir=None)
    outcomes = Outcomes(audit, grace_seconds=1, min_free_bytes=0)  # type: ignore[arg-type]
    monitor = HealthMonitor(HealthConfig(), SimpleNamespace(data_check=None), audit, SimpleNamespace())  # type: ignore[arg-type]
    monitor.opa_ok_at, monitor.opa_error, monitor.revision = time.monotonic(), None, "files:0123456789ab"
    monitor.outcomes = outcomes
    assert monitor.checks()["audit"]["ok"]
    outcomes.store_failed(DatabaseUnavailable("PostgreSQL cannot be reached: Connect call failed ('10.0.0.9', 5432)"))
    outcomes._store_error_at -= 3  # past the hold (STORE_ERROR_HOLD_SECONDS): calls are no longer refused for it
    assert outcomes.store_problem(check_space=False) is None
    public, private = monitor.checks()["audit"], monitor.checks(private=True)["audit"]
    assert not public["ok"] and "nothing has committed since" in public["detail"], public
    assert "10.0.0.9" not in public["detail"] and "10.0.0.9" in private["detail"], (public, private)
    audit.last_commit_at = time.monotonic()  # a call's records (or the probe's write) committed
    assert monitor.checks()["audit"]["ok"], monitor.checks()["audit"]

    monitor.audit_probe_error = monitor.audit_probe_public = "audit store refuses writes (AuditStoreError)"
    monitor.audit_probe_failed_at, monitor.audit_probe_timed_out = time.monotonic(), False
    assert not monitor.checks()["audit"]["ok"]
    audit.last_commit_at = time.monotonic() + 0.001
    assert monitor.checks()["audit"]["ok"], monitor.checks()["audit"]

    monitor.audit_probe_error = monitor.audit_probe_public = "audit store did not commit within 5 s"
    monitor.audit_probe_failed_at, monitor.audit_probe_timed_out = time.monotonic(), True
    audit.last_commit_at = time.monotonic() + 0.001
    assert not monitor.checks()["audit"]["ok"]  # perhaps the timed-out probe's own late write
