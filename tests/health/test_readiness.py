"""Readiness tells the truth: the real OPA stopped or answering garbage, a full audit disk, a
shutting-down gateway turn /readyz red with the reason; Proxmox refusing the token does not, but
shows per cluster. Everything here is a real gateway, a real OPA and the simulator."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import ConfigError, load
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.policy.revision import files_revision
from tests.health.conftest import base_url, health_env, http_client, stop_process, wait_for, with_port
from tests.support import GatewayThread, audit_rows, free_port


def _ready(r: Any) -> bool:
    return bool(r.status_code == 200)


def _unready(r: Any) -> bool:
    return bool(r.status_code == 503)


async def test_ready_gateway_says_why_it_is_ready(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            live = await http.get(base + "/livez")
            assert live.status_code == 200 and live.json() == {"status": "alive"}
            ready = await http.get(base + "/readyz")
            assert ready.status_code == 200, ready.text
            doc = ready.json()
            assert doc["status"] == "ready" and doc["reasons"] == []
            assert all(c["ok"] for c in doc["checks"].values()), doc
            # a policy directory's revision: the content digest of the files the managed OPA loaded
            assert doc["checks"]["policy"] == {
                "ok": True,
                "detail": None,
                "revision": files_revision((REPO_ROOT / "policies",)),
                "source": "files",
                "since": doc["checks"]["policy"]["since"],
                "data_valid": True,
                "catalog_problems": 0,  # the data names only what the served catalog has (a count here)
            }
            assert doc["checks"]["opa"]["last_decision_age_seconds"] < 3
            r, _ = await wait_for(
                http, base + "/readyz", lambda r: r.json()["clusters"]["default"]["state"] != "unknown"
            )
            assert r.json()["clusters"]["default"]["state"] == "ok"
            # /healthz is readiness (an alias kept for existing probes), and so is /admin/health, with more
            alias = await http.get(base + "/healthz")
            assert alias.status_code == 200 and alias.json()["checks"].keys() == doc["checks"].keys()
            admin_token = env.config.admin.token.read()  # type: ignore[union-attr]
            admin = await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {admin_token}"})
            assert admin.status_code == 200 and admin.json()["status"] == "ready"
            assert admin.json()["opa"]["process_alive"] is True and "path" in admin.json()["audit"]
            assert (await http.get(base + "/admin/health")).status_code == 401
            # probes answer whatever Host a load balancer sends (it probes by address)
            odd = await http.get(base + "/readyz", headers={"Host": "10.9.8.7:8443"})
            assert odd.status_code == 200
            assert (await http.get(base + "/mcp", headers={"Host": "10.9.8.7:8443"})).status_code == 421
    finally:
        gw.stop()


async def test_sigstopped_opa_turns_readiness_red_then_green(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    sidecar = gw.components.sidecar
    assert sidecar is not None and sidecar.process is not None
    pid = sidecar.process.pid
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            stop_process(pid)
            try:
                red, took = await wait_for(http, base + "/readyz", _unready, timeout=10)
                doc = red.json()
                assert "opa: OPA did not answer within 500 ms" in doc["reasons"], doc
                assert took < 5, f"red only after {took:.1f}s"
                assert doc["checks"]["audit"]["ok"] and doc["checks"]["draining"]["ok"]
                assert (await http.get(base + "/livez")).status_code == 200  # alive, just not ready
                assert sidecar.alive()  # the process is there: only a real decision tells the truth
            finally:
                os.kill(pid, signal.SIGCONT)
            green, _ = await wait_for(http, base + "/readyz", _ready, timeout=10)
            assert green.json()["reasons"] == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        gw.stop()


async def test_invalid_policy_data_is_unready_and_refuses_calls(hsim: Any, tmp_path: Path) -> None:
    """Data checked at activation (not per call): broken data makes the gateway unready with the
    problem named, and every call is refused with it (code data.invalid), never run."""
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree, ignore=shutil.ignore_patterns("golden", "*_test.rego"))
    data = tree / "data" / "data.yaml"
    data.write_text(data.read_text().replace("  protected_tags:", "  protected_tag:", 1))
    env = health_env(tmp_path / "gw", hsim, opa={"mode": "managed", "policies": [str(tree)]})
    gw = GatewayThread(env.config).start()
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(http, base_url(env.config) + "/readyz", _unready)
            policy = r.json()["checks"]["policy"]
            assert policy["ok"] is False and policy["data_valid"] is False, policy
            # /readyz counts the problems; /admin/health names them (tests/health/test_s51_readyz_policy_problems.py)
            assert policy["detail"].endswith(": 1 problem (details in /admin/health)"), policy
            assert any(x.startswith("policy: policy data invalid") for x in r.json()["reasons"])
            call = await http.post(
                env.url,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {"name": "list_nodes", "arguments": {}},
                },
                headers={
                    "Authorization": f"Bearer {env.token('data-check-op', ['operator'])}",
                    "MCP-Protocol-Version": "2025-06-18",
                    "Accept": "application/json, text/event-stream",
                },
            )
            assert call.status_code == 200, call.text
            result = call.json()["result"]
            assert result["isError"] is True
            assert "policy data error: guardrails.protected_tag: unknown key" in json.dumps(result)
        rows = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "decision"]
        assert rows and all(r["outcome"] == "deny" for r in rows)
        assert not [r for r in audit_rows(env.config.audit_path) if r["kind"] == "result"]
    finally:
        gw.stop()


GARBAGE_POLICY = 'package pvegate\n\ndecision := {"allow": true, "verdict": "sure, whatever"}\n'


async def test_opa_answering_garbage_is_red(hsim: Any, tmp_path: Path) -> None:
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "garbage.rego").write_text(GARBAGE_POLICY)
    env = health_env(tmp_path / "gw", hsim, opa={"mode": "managed", "policies": [str(tmp_path / "policy")]})
    gw = GatewayThread(env.config).start()
    try:
        async with http_client(env) as http:
            r = await http.get(base_url(env.config) + "/readyz")
            assert r.status_code == 503
            reasons = r.json()["reasons"]
            assert any(x.startswith("opa: decision does not match the contract") for x in reasons), reasons
            assert r.json()["checks"]["policy"]["ok"] is False  # no valid decision: no revision either
    finally:
        gw.stop()


async def test_unreachable_external_opa_is_red(hsim: Any, tmp_path: Path) -> None:
    token = tmp_path / "opa-token"
    token.write_text("external-opa-token\n")
    opa = {"mode": "external", "url": f"http://127.0.0.1:{free_port()}", "token": {"file": str(token)}}
    env = health_env(tmp_path / "gw", hsim, opa=opa)
    gw = GatewayThread(env.config).start()
    try:
        async with http_client(env) as http:
            r = await http.get(base_url(env.config) + "/readyz")
            assert r.status_code == 503
            assert "opa: OPA unreachable: ClientConnectorError" in r.json()["reasons"], r.json()
    finally:
        gw.stop()


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot build a small file system to fill")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, timeout=10
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}): the full-disk test needs root")


def _fill(where: Path) -> Path:
    ballast = where / "ballast"
    with ballast.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return ballast


async def test_full_audit_disk_is_red_and_recovers(hsim: Any, tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "2m")
    try:
        # no free-space floor: what turns readiness red here is a commit the store refused
        env = health_env(tmp_path / "gw", hsim, audit={"path": str(disk / "audit.db"), "min_free_mb": 0})
        gw = GatewayThread(env.config).start()
        base = base_url(env.config)
        try:
            async with http_client(env) as http:
                await wait_for(http, base + "/readyz", _ready)
                ballast = _fill(disk)
                red, _ = await wait_for(http, base + "/readyz", _unready, timeout=10)
                reasons = red.json()["reasons"]
                refuses = "audit: audit store refuses writes (OperationalError"
                assert any(r.startswith(refuses) for r in reasons), reasons
                assert red.json()["checks"]["opa"]["ok"]  # only the audit is at fault
                # SQLite's own words: for the operator (/readyz takes no credential)
                token = env.config.admin.token.read()  # type: ignore[union-attr]
                admin = await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {token}"})
                assert any("database or disk is full" in r for r in admin.json()["reasons"]), admin.text
                assert gw.components.audit.write_failures >= 1
                ballast.unlink()
                await wait_for(http, base + "/readyz", _ready, timeout=10)
        finally:
            gw.stop()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=10)


async def test_audit_disk_below_the_free_space_floor_is_red(hsim: Any, tmp_path: Path) -> None:
    # the floor readiness uses is the one calls are refused below: audit.min_free_mb
    env = health_env(tmp_path, hsim, audit={"min_free_mb": 2**40})
    gw = GatewayThread(env.config).start()
    try:
        async with http_client(env) as http:
            r = await http.get(base_url(env.config) + "/readyz")
            assert r.status_code == 503
            (reason,) = r.json()["reasons"]
            assert reason.startswith("audit: ") and "bytes free on the audit store's file system" in reason
    finally:
        gw.stop()


async def test_an_audit_directory_that_cannot_be_checked_is_red(hsim: Any, tmp_path: Path) -> None:
    """Calls are refused when the store's free space cannot be checked (its directory renamed or gone):
    readiness said ready all the while, the open file still taking the probe's commit. (Commits are refused
    too now, the file being gone from audit.path: readiness names that, the cause, not the failed commit.)"""
    store = tmp_path / "store"
    env = health_env(tmp_path / "gw", hsim, audit={"path": str(store / "audit.db")})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            store.rename(tmp_path / "moved")
            try:
                red, _ = await wait_for(http, base + "/readyz", _unready, timeout=10)
                reasons = red.json()["reasons"]
                gone = "audit: the audit database file is gone from audit.path (removed or renamed)"
                assert reasons == [gone], reasons
            finally:
                (tmp_path / "moved").rename(store)
            await wait_for(http, base + "/readyz", _ready, timeout=10)
    finally:
        gw.stop()


async def test_draining_gateway_is_unready_but_alive(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            assert gw.components.health is not None
            gw.components.health.draining = True  # what graceful shutdown sets first
            r = await http.get(base + "/readyz")
            assert r.status_code == 503 and r.json()["reasons"] == ["draining: shutting down"]
            assert (await http.get(base + "/livez")).status_code == 200
    finally:
        gw.stop()


async def test_proxmox_rejecting_the_token_keeps_readiness_green(hsim: Any, tmp_path: Path) -> None:
    env = health_env(tmp_path, hsim)
    raw = yaml.safe_load(env.config_path.read_text())
    wrong = tmp_path / "secrets" / "wrong-pve-token"
    wrong.write_text("root@pam!pvegate=00000000-0000-0000-0000-000000000000\n")
    raw["clusters"][0]["token"] = {"file": str(wrong)}
    gone = dict(raw["clusters"][0], name="gone", api_url=f"https://127.0.0.1:{free_port()}/api2/json")
    raw["clusters"].append(gone)
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    cfg = with_port(load(env.config_path))
    gw = GatewayThread(cfg).start()
    base = base_url(cfg)
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(
                http,
                base + "/readyz",
                lambda r: all(c["state"] != "unknown" for c in r.json()["clusters"].values()),
            )
            assert r.status_code == 200 and r.json()["reasons"] == []
            clusters = r.json()["clusters"]
            assert clusters["default"]["state"] == "unauthorized"
            assert clusters["default"]["detail"] == "Proxmox rejected the gateway's API token"
            assert clusters["gone"]["state"] == "unreachable"
            # the connection error names the API's address: for the operator, not on /readyz (no credential)
            where = gone["api_url"].split("/")[2]
            assert where not in r.text and clusters["gone"]["detail"].endswith("(details in /admin/health)"), r.text
            token = cfg.admin.token.read()  # type: ignore[union-attr]
            admin = await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {token}"})
            assert where in admin.json()["clusters"]["gone"]["detail"], admin.text
            m = await http.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
            assert 'pvegate_cluster_up{cluster="default"} 0.0' in m.text
            assert 'pvegate_cluster_state{cluster="default",state="unauthorized"} 1.0' in m.text
            assert 'pvegate_cluster_probes_total{cluster="gone",state="unreachable"}' in m.text
            assert "pvegate_ready 1.0" in m.text
    finally:
        gw.stop()


async def test_a_cluster_never_probed_is_not_reported_down(hsim: Any, tmp_path: Path) -> None:
    """cluster_probe_interval 0 turns the probes off: pvegate_cluster_up said 0 for good, and the
    alert deployment.md suggests (pvegate_cluster_up == 0) fired for a cluster that answers."""
    env = health_env(tmp_path, hsim, health={"cluster_probe_interval": 0})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", _ready)
            token = env.config.admin.token.read()  # type: ignore[union-attr]
            m = await http.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"})
            assert 'pvegate_cluster_state{cluster="default",state="unknown"} 1.0' in m.text
            assert "pvegate_cluster_up{" not in m.text, [ln for ln in m.text.splitlines() if "cluster_up" in ln]
    finally:
        gw.stop()


def test_health_settings_are_checked(tmp_path: Path, hsim: Any) -> None:
    env = health_env(tmp_path, hsim)
    raw = yaml.safe_load(env.config_path.read_text())
    for bad, why in (
        (
            {"opa_probe_intervall": 1},
            "health.opa_probe_intervall: unknown setting; did you mean health.opa_probe_interval",
        ),
        ({"opa_probe_interval": 0}, "health.opa_probe_interval"),
        ({"audit_min_free_bytes": 0}, "health.audit_min_free_bytes: unknown setting"),
        ({"cluster_probe_interval": "often"}, "health.cluster_probe_interval"),
    ):
        raw["health"] = bad
        env.config_path.write_text(yaml.safe_dump(raw))
        with pytest.raises(ConfigError, match=why):
            load(env.config_path)
