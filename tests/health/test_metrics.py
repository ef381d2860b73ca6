"""/metrics: protected, Prometheus text format, and counting what really happened (real OPA,
real simulator with faults, real calls)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.dev.devenv import DevEnv
from tests.health.conftest import base_url, health_env, http_client, serving, stop_process, wait_for
from tests.resilience.helpers import call, result_of, text_of
from tests.support import GatewayThread, audit_rows

Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Snapshot:
    """Every sample of an exposition, by name and sorted labels (parsed, not grepped)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snap: Snapshot, name: str, **labels: str) -> float:
    return snap.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(
    http: httpx.AsyncClient, cfg_url: str, token: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = await http.get(cfg_url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(r.text)


def _env(tmp_path: Path, hsim: Any) -> tuple[DevEnv, str]:
    scrape_file = tmp_path / "scrape-token"
    scrape_file.write_text("scrape-only-" + os.urandom(12).hex() + "\n")
    env = health_env(tmp_path / "gw", hsim, metrics={"token": {"file": str(scrape_file)}})
    return env, scrape_file.read_text().strip()


async def test_metrics_need_the_scrape_or_admin_token(hsim: Any, tmp_path: Path) -> None:
    env, scrape_token = _env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            assert (await http.get(base + "/metrics")).status_code == 401
            jwt = env.token("metrics-curious", ["operator"])
            assert (await http.get(base + "/metrics", headers={"Authorization": f"Bearer {jwt}"})).status_code == 401
            wrong = await http.get(base + "/metrics", headers={"Authorization": "Bearer " + scrape_token + "x"})
            assert wrong.status_code == 401
            refusals = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "auth_failure"]
            assert sum('"surface":"metrics"' in r["body"] for r in refusals) == 3  # refused scrapes are audited
            await scrape(http, base, scrape_token)
            admin = env.config.admin.token.read()  # type: ignore[union-attr]
            snap = await scrape(http, base, admin)
            assert value(snap, "pvegate_ready") == 1.0
            # the scrape token is no operator credential
            r = await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {scrape_token}"})
            assert r.status_code == 401
            admin_metrics = await http.get(base + "/admin/metrics", headers={"Authorization": f"Bearer {admin}"})
            assert admin_metrics.status_code == 200 and "pvegate_phase_seconds_bucket" in admin_metrics.text
    finally:
        gw.stop()


async def test_metrics_count_decisions_phases_and_upstream_errors(hsim: Any, tmp_path: Path) -> None:
    env, scrape_token = _env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    url = base + "/mcp"
    operator = env.token("metrics-operator", ["operator"])
    viewer = env.token("metrics-viewer", ["viewer"])
    try:
        async with http_client(env) as http:
            http.timeout = httpx.Timeout(30.0)
            before = await scrape(http, base, scrape_token)
            assert value(before, "pvegate_calls_interrupted_total") == 0.0  # defined from the start
            assert value(before, "pvegate_calls_in_flight") == 0.0
            revision = [k for k in before if k[0] == "pvegate_opa_policy_revision_info"]
            assert len(revision) == 1 and dict(revision[0][1])["revision"].startswith("files:")

            ok = result_of(await call(http, url, operator, "list_nodes"))
            assert not ok.get("isError"), text_of(ok)
            denied = result_of(await call(http, url, viewer, "snapshot_create", {"vmid": 100, "snapname": "m1"}))
            assert denied.get("isError") and "Denied by policy" in text_of(denied)

            sidecar = gw.components.sidecar
            assert sidecar is not None and sidecar.process is not None
            stop_process(sidecar.process.pid)
            try:
                failed = result_of(await call(http, url, operator, "list_nodes"))
            finally:
                os.kill(sidecar.process.pid, signal.SIGCONT)
            assert "policy decision unavailable" in text_of(failed)
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)

            # a Proxmox slower than the cluster timeout (1.5 s), then a Proxmox answering 5xx
            hsim.set_faults(latency_ms=2500)
            slow = asyncio.create_task(call(http, url, operator, "list_nodes"))
            await asyncio.sleep(0.8)
            during = await scrape(http, base, scrape_token)
            assert value(during, "pvegate_calls_in_flight") == 1.0
            timed_out = result_of(await slow)
            assert "did not answer in time" in text_of(timed_out), text_of(timed_out)
            hsim.set_faults(latency_ms=0, error_rate=1.0)
            errored = result_of(await call(http, url, operator, "list_nodes"))
            assert errored.get("isError")
            hsim.set_faults(error_rate=0)

            after = await scrape(http, base, scrape_token)
    finally:
        gw.stop()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # two allowed calls that then failed upstream, one before; one policy denial; one failed closed
    assert delta("pvegate_decisions_total", outcome="allow") == 3
    assert delta("pvegate_decisions_total", outcome="deny") == 1
    assert delta("pvegate_decisions_total", outcome="failed_closed") == 1
    assert delta("pvegate_upstream_errors_total", cluster="default", kind="api", reason="timeout") == 1
    assert delta("pvegate_upstream_errors_total", cluster="default", kind="api", reason="error") == 1
    assert value(after, "pvegate_calls_in_flight") == 0.0
    for phase, n in (("authenticate", 5), ("decide", 5), ("dispatch", 3), ("audit", 8)):
        assert delta("pvegate_phase_seconds_count", phase=phase) >= n, phase
    assert delta("pvegate_call_seconds_count", outcome="failed") == 2
    assert delta("pvegate_call_seconds_count", outcome="denied") == 2
    assert delta("pvegate_audit_records_total", kind="decision", outcome="deny") == 2
    assert value(after, "pvegate_audit_write_failures_total") == 0.0
    assert value(after, "pvegate_audit_leases_lost_total") == 0.0  # SQLite: one host, no lease


async def test_serve_freezes_its_start_up_heap(hsim: Any, tmp_path: Path) -> None:
    """`pvegate serve` moves start-up's objects out of the cyclic collector's sight: a full collection
    over the catalog and both PVE schemas paused the event loop for 60-126 ms under load."""
    env, scrape_token = _env(tmp_path, hsim)
    async with serving(env, tmp_path / "serve.log") as (http, base):
        frozen = value(await scrape(http, base, scrape_token), "pvegate_python_gc_frozen_objects")
    assert frozen > 50_000, frozen  # the catalog, both schemas and the validators: hundreds of thousands
