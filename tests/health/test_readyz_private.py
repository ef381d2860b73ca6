"""/readyz takes no credential (load balancers probe it): it says why the gateway is unready in the
gateway's own words, never with the text of a store's or OPA's error (a PostgreSQL database's name, host
or role, a file path, an OPA address), which GET /admin/health (admin token) shows. Both give the same
verdict, status code and checks. GET /admin/audit/verify answers an audit database it cannot reach with
503 and Retry-After (nothing was checked), not 409 (a chain that does not verify)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import httpx

from gateway.core.config import HealthConfig
from gateway.observability.health import HealthMonitor
from gateway.policy.opa_guard import open_access_message
from gateway.store.audit_seal import HeadKey
from gateway.store.outcomes import RETRY_AFTER_SECONDS
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database, sign_new_chain
from tests.support import GatewayThread

DETAILS = "details in /admin/health"


@contextlib.asynccontextmanager
async def _gateway_on_pg(
    hsim: Any, postgres: PostgresServer, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, str, dict[str, str], str]]:
    """A gateway on a database of its own on `postgres`, ready: (client, base URL, operator headers, the
    database's name)."""
    url = await new_pg_database(postgres)
    env = health_env(tmp_path / "gw", hsim, storage={"url": url}, health={"cluster_probe_interval": 0})
    HeadKey.create(env.config.audit_key_path)  # what `pvegate db upgrade` makes once ...
    await sign_new_chain(url, env.config.audit_key_path)  # ... and signs the new chain's mark with
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    admin_token = env.config.admin.token.read()  # type: ignore[union-attr]
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
            yield http, base, {"Authorization": f"Bearer {admin_token}"}, url.rsplit("/", 1)[1]
    finally:
        gw.stop()


async def _drop(postgres: PostgresServer, name: str) -> None:
    """The database goes away under the running gateway: its connections are ended, and each reconnection
    is refused with PostgreSQL's text naming the database."""
    admin = await asyncpg.connect(postgres.dsn)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_readyz_leaves_the_store_text_to_admin_health(
    hsim: Any, postgres: PostgresServer, tmp_path: Path
) -> None:
    async with _gateway_on_pg(hsim, postgres, tmp_path) as (http, base, operator, name):
        await _drop(postgres, name)  # the marker: the database's name, in PostgreSQL's refusal

        def named(r: Any) -> bool:
            return bool(r.status_code == 503 and name in (r.json()["checks"]["audit"]["detail"] or ""))

        deadline = time.monotonic() + 20
        while not named(private := await http.get(base + "/admin/health", headers=operator)):
            assert time.monotonic() < deadline, private.text[:800]
            await asyncio.sleep(0.2)
        assert private.json()["status"] == "unready"
        assert any(name in r for r in private.json()["reasons"]), private.json()["reasons"]
        # the public view, polled for a while: unready for the same checks, the store's text never in it
        for _ in range(10):
            public = await http.get(base + "/readyz")
            doc = public.json()
            assert public.status_code == 503 and doc["status"] == "unready", public.text[:800]
            assert name not in public.text, public.text[:800]
            assert set(doc["checks"]) == set(private.json()["checks"])
            assert {k: c["ok"] for k, c in doc["checks"].items()} == {
                k: c["ok"] for k, c in private.json()["checks"].items()
            }
            audit = doc["checks"]["audit"]
            assert not audit["ok"] and audit["detail"].startswith("audit store refuses writes ("), audit
            assert audit["detail"].endswith(f"{DETAILS})"), audit
            await asyncio.sleep(0.1)


async def test_admin_audit_verify_of_an_unreachable_database_is_503(
    hsim: Any, postgres: PostgresServer, tmp_path: Path
) -> None:
    async with _gateway_on_pg(hsim, postgres, tmp_path) as (http, base, operator, name):
        assert (await http.get(base + "/admin/audit/verify", headers=operator)).status_code == 200
        await _drop(postgres, name)
        # nothing could be checked: not a chain that fails verification (409)
        verify = await http.get(base + "/admin/audit/verify", headers=operator)
        assert verify.status_code == 503, verify.text[:800]
        assert verify.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
        assert verify.json()["unreachable"] is True and verify.json()["ok"] is False


def _monitor() -> HealthMonitor:
    decisions = SimpleNamespace(data_check=None, refusal=None)
    audit = SimpleNamespace(last_commit_at=time.monotonic(), last_error=None, local_dir=None)
    monitor = HealthMonitor(HealthConfig(), decisions, audit, SimpleNamespace())  # type: ignore[arg-type]
    monitor.opa_ok_at, monitor.opa_error, monitor.revision = time.monotonic(), None, "files:0123456789ab"
    return monitor


def test_each_failure_text_stays_in_the_private_view() -> None:
    """Each detail that carries text from outside the gateway: the private view has it, the public one
    says the same thing in the gateway's words, with the same verdict."""
    monitor = _monitor()
    opa_url = "http://opa-secret-host.internal:8181"
    monitor.opa_error = open_access_message(opa_url)  # an external OPA answering without a token
    monitor.data_check_error = "policy data check unavailable: OPA unreachable at /var/run/secret-opa.sock"
    monitor.audit.last_error = "OperationalError: unable to open database file /srv/secret-audit/audit.db"
    private_ready, private = monitor.readiness(private=True)
    public_ready, public = monitor.readiness()
    assert private_ready is public_ready is False
    assert set(public["checks"]) == set(private["checks"]) and len(public["reasons"]) == len(private["reasons"])
    for marker in (opa_url, "secret-opa.sock", "/srv/secret-audit"):
        assert marker in str(private), marker
        assert marker not in str(public), marker
    checks = public["checks"]
    assert "answers without a token" in checks["opa"]["detail"], checks["opa"]
    assert checks["policy"]["detail"] == f"policy data check unavailable ({DETAILS})"
    assert checks["audit"]["detail"] == f"audit store refuses writes (OperationalError; {DETAILS})"
