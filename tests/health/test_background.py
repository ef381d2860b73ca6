"""Health and metrics of what runs behind the calls: the outcome reconciler (its last pass, the calls
it leaves open, its task dying) and the approvals database (down or hung: /metrics and /admin/health
still answer, and say so). Real gateways, the real OPA, the simulator and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core.config import Config
from gateway.dev.devenv import DevEnv
from gateway.store import reconcile
from gateway.store.audit import AuditLog, AuditRecord, known_secrets
from gateway.store.audit_seal import HeadKey
from gateway.store.db import PostgresDatabase
from gateway.store.pgsync import audit_location
from gateway.store.schema import upgrade_all
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.health.test_metrics import samples, value
from tests.pgserver import PostgresServer, start_postgres
from tests.store.auditstore import sign_new_chain
from tests.support import GatewayThread, audit_rows

UPID = "UPID:pve1:000F6AAE:0A1B2C3D:65000000:qmstart:100:pvegate@pve!gw:"


def _env(tmp_path: Path, hsim: Any, **extra: Any) -> tuple[DevEnv, str]:
    scrape_file = tmp_path / "scrape-token"
    scrape_file.write_text("scrape-only-" + os.urandom(12).hex() + "\n")
    env = health_env(tmp_path / "gw", hsim, metrics={"token": {"file": str(scrape_file)}}, **extra)
    return env, scrape_file.read_text().strip()


async def seed_retired_call(config: Config) -> None:
    """What an earlier run left: a vm_start on a cluster this configuration no longer names, its
    task started (UPID), its result never written."""
    log = AuditLog(audit_location(config), secrets=known_secrets(config), head_key=config.audit_key_path)
    await log.open()
    try:
        target = {"cluster": "retired", "node": "pve1", "vmid": 100, "kind": "qemu"}
        key = "retired/qemu/100"
        await log.append(
            AuditRecord("retired-1", "received", "agent", "vm_start", key, None, {"target": target, "effect": "write"}),
            AuditRecord("retired-1", "decision", "agent", "vm_start", key, "allow", {"allow": True}),
            AuditRecord("retired-1", "dispatch", "agent", "vm_start", key, "accepted", {"task_id": UPID}),
        )
    finally:
        await log.close()


async def metrics_of(http: httpx.AsyncClient, base: str, token: str) -> dict[Any, float]:
    r = await http.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return samples(r.text)


async def admin_health(http: httpx.AsyncClient, env: DevEnv) -> httpx.Response:
    token = env.config.admin.token.read()  # type: ignore[union-attr]
    return await http.get(base_url(env.config) + "/admin/health", headers={"Authorization": f"Bearer {token}"})


async def test_the_reconciler_is_seen_in_readiness_admin_health_and_metrics(hsim: Any, tmp_path: Path) -> None:
    env, scrape_token = _env(tmp_path, hsim)
    await seed_retired_call(env.config)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(
                http, base + "/readyz", lambda r: r.json()["checks"].get("reconcile", {}).get("last_pass_age_seconds")
            )
            check = r.json()["checks"]["reconcile"]
            assert r.status_code == 200 and check["ok"] and check["detail"] is None, r.text
            assert check["open_calls"] == 0
            # the earlier run's call on a cluster no longer configured: settled, saying it could not be checked
            result = [row for row in audit_rows(env.config.audit_path, "retired-1") if row["kind"] == "result"]
            assert [row["outcome"] for row in result] == ["reconciled"]
            body = json.loads(result[0]["body"])
            assert body["proxmox"] == "unverifiable" and body["task_id"] == UPID
            assert body["reason"].startswith("cluster retired is not in this configuration")

            admin = await admin_health(http, env)
            assert admin.status_code == 200, admin.text
            rec = admin.json()["reconcile"]
            assert rec["task_alive"] and rec["task_error"] is None and rec["open_calls"] == 0
            assert rec["earlier_runs_settled"] and rec["last_pass_at"] > time.time() - 60
            assert admin.json()["approvals_pending"] == 0 and admin.json()["approvals_error"] is None

            snap = await metrics_of(http, base, scrape_token)
            assert value(snap, "pvegate_health_check_ok", check="reconcile") == 1.0
            assert value(snap, "pvegate_reconcile_open_calls") == 0.0
            assert time.time() - 60 < value(snap, "pvegate_reconcile_last_pass_timestamp_seconds") <= time.time()
            assert value(snap, "pvegate_calls_reconciled_total", result="unverifiable") == 1.0
            assert value(snap, "pvegate_approvals_state_unavailable") == 0.0
            assert ("pvegate_approvals", (("state", "pending"),)) in snap
    finally:
        gw.stop()


async def test_a_dead_reconciler_turns_readiness_red(
    hsim: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing outside a bug ends the loop (each pass catches its errors), so the fault is injected:
    the summary of the first pass raises, outside any pass's error handling."""
    env, scrape_token = _env(tmp_path, hsim)
    await seed_retired_call(env.config)

    def broken(settled: list[reconcile.Settled]) -> str:
        raise RuntimeError("injected")

    monkeypatch.setattr(reconcile, "summary", broken)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    sidecar = gw.components.sidecar
    assert sidecar is not None and sidecar.process is not None
    opa = sidecar.process
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(http, base + "/readyz", lambda r: r.status_code == 503)
            # /readyz (no credential) names the exception's type; its text is for /admin/health
            public = "reconcile: the reconciler task died (RuntimeError; details in /admin/health)"
            assert r.json()["reasons"] == [public], r.text
            admin = (await admin_health(http, env)).json()
            assert admin["reconcile"]["task_alive"] is False
            assert admin["reasons"] == ["reconcile: the reconciler task died (RuntimeError: injected)"], admin
            snap = await metrics_of(http, base, scrape_token)
            assert value(snap, "pvegate_health_check_ok", check="reconcile") == 0.0
            assert value(snap, "pvegate_ready") == 0.0
    finally:
        gw.stop()
    # the dead task's error did not cut the shutdown short: OPA was stopped with the gateway
    assert opa.poll() is not None, "the managed OPA outlived the gateway"


# --- the approvals database down or hung ------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """pid and all its descendants (the postmaster and its backends)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                out += _tree(int(child))
    return out


@contextlib.contextmanager
def frozen(server: PostgresServer) -> Iterator[None]:
    """Every PostgreSQL process stopped (SIGSTOP): connections stay open, no query is ever answered."""
    pids = _tree(server.proc.pid)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def test_metrics_and_admin_health_answer_with_the_approvals_database_down(hsim: Any, tmp_path: Path) -> None:
    server = start_postgres()  # its own server: this test stops it
    try:
        url = await server.create_database()
        db = PostgresDatabase(url)
        await db.open()
        await upgrade_all(db)
        await db.close()
        env, scrape_token = _env(tmp_path, hsim, storage={"url": url, "pool_max_size": 4})
        env.config.audit_key_path.parent.mkdir(parents=True, exist_ok=True)
        HeadKey.create(env.config.audit_key_path)  # what `pvegate db upgrade` leaves for every replica,
        await sign_new_chain(url, env.config.audit_key_path)  # with the new chain's mark signed by it
        gw = GatewayThread(env.config).start()
        base = base_url(env.config)
        try:
            async with http_client(env) as http:
                http.timeout = httpx.Timeout(20.0)
                snap = await metrics_of(http, base, scrape_token)
                assert value(snap, "pvegate_approvals_state_unavailable") == 0.0
                assert ("pvegate_approvals", (("state", "pending"),)) in snap

                with frozen(server):  # hung: every query waits forever (asyncpg's own timeout is 30 s)
                    started = time.monotonic()
                    snap = await metrics_of(http, base, scrape_token)
                    assert time.monotonic() - started < 6
                    assert value(snap, "pvegate_approvals_state_unavailable") == 1.0
                    assert not any(name == "pvegate_approvals" for name, _ in snap)  # no made-up zeros
                    assert ("pvegate_phase_seconds_count", (("phase", "decide"),)) in snap  # the rest is there
                    assert ("pvegate_health_check_ok", (("check", "opa"),)) in snap
                    started = time.monotonic()
                    admin = await admin_health(http, env)
                    assert time.monotonic() - started < 6
                    assert admin.status_code in (200, 503), admin.text  # the audit is on that server too
                    assert admin.json()["approvals_pending"] is None
                    assert "did not answer within 2 s" in admin.json()["approvals_error"]

                server.halt()  # down: connections refused
                snap = await metrics_of(http, base, scrape_token)
                assert value(snap, "pvegate_approvals_state_unavailable") == 1.0
                assert value(snap, "pvegate_opa_up") == 1.0
                admin = await admin_health(http, env)
                assert admin.status_code in (200, 503) and admin.json()["approvals_pending"] is None, admin.text
                assert "PostgreSQL cannot be reached" in admin.json()["approvals_error"]

                server.resume()  # back: the same pool serves again, and the series with it
                deadline = time.monotonic() + 20
                while value(snap := await metrics_of(http, base, scrape_token), "pvegate_approvals_state_unavailable"):
                    assert time.monotonic() < deadline, "approval counts never came back"
                    await asyncio.sleep(0.2)
                assert value(snap, "pvegate_approvals", state="pending") == 0.0
                assert (await admin_health(http, env)).json()["approvals_error"] is None
        finally:
            gw.stop()
    finally:
        server.stop()
