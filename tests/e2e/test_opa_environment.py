"""The managed OPA's process: a less eager Go collector, and none of the gateway's environment."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.policy.bundles import build, keygen
from gateway.policy.opa_sidecar import OPASidecar

ROOT = Path(__file__).resolve().parents[2]


def _gogc_of(sidecar: OPASidecar) -> float:
    """What the running OPA's Go runtime reports as its GOGC (Prometheus metrics)."""
    text = httpx.get(f"{sidecar.url}/metrics", headers=sidecar.auth_headers, timeout=5).text
    for line in text.splitlines():
        if line.startswith("go_gc_gogc_percent "):
            return float(line.split()[1])
    raise AssertionError("OPA's /metrics has no go_gc_gogc_percent")


@pytest.mark.parametrize(("environ", "expected"), [(None, 400.0), ("150", 150.0)])
def test_sidecar_gogc(monkeypatch: pytest.MonkeyPatch, environ: str | None, expected: float) -> None:
    if environ is None:
        monkeypatch.delenv("GOGC", raising=False)
    else:
        monkeypatch.setenv("GOGC", environ)
    sidecar = OPASidecar(policies=(ROOT / "policies",), decision_logs=False)
    sidecar.start()
    try:
        assert _gogc_of(sidecar) == expected
    finally:
        sidecar.stop()


def test_sidecar_does_not_inherit_the_gateways_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A policy sees its process environment (opa.runtime().env): it must hold no gateway secret."""
    monkeypatch.setenv("PVEGATE_TEST_PVE_TOKEN", "root@pam!gw=5ecret-5ecret")
    monkeypatch.setenv("GOMAXPROCS", "2")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/secrets/5ecret-sa.json")
    (tmp_path / "env.rego").write_text("package probe\n\nenv := opa.runtime().env\n")
    sidecar = OPASidecar(policies=(tmp_path,), decision_logs=False)
    sidecar.start()
    try:
        r = httpx.post(f"{sidecar.url}/v1/data/probe/env", json={}, headers=sidecar.auth_headers, timeout=5)
        env = r.json()["result"]
    finally:
        sidecar.stop()
    assert "PATH" in env and env["GOGC"] == "400" and env["GOMAXPROCS"] == "2"
    assert "PVEGATE_TEST_PVE_TOKEN" not in env and "GOOGLE_APPLICATION_CREDENTIALS" not in env
    assert not any("5ecret" in v for v in env.values())


def test_only_the_gateway_may_use_the_managed_opas_api() -> None:
    """Policies loaded from a directory are writable through OPA's REST API: the token guards it."""
    sidecar = OPASidecar(policies=(ROOT / "policies",), decision_logs=False)
    sidecar.start()
    try:
        base = sidecar.url
        grab_admin = [{"name": "local", "role": "admin", "subjects": ["intruder"]}]
        evil = "package pvegate.evil\n\nx := 1\n"
        assert httpx.put(f"{base}/v1/data/data/bindings", json=grab_admin, timeout=5).status_code == 401
        assert httpx.put(f"{base}/v1/policies/evil", content=evil, timeout=5).status_code == 401
        assert httpx.post(f"{base}/v1/data/pvegate/decision", json={"input": {}}, timeout=5).status_code == 401
        forged = {"Authorization": "Bearer not-the-token"}
        assert httpx.get(f"{base}/v1/data/data/bindings", headers=forged, timeout=5).status_code == 401
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200  # probes need no token
        r = httpx.get(f"{base}/v1/data/data/bindings", headers=sidecar.auth_headers, timeout=5)
        assert r.status_code == 200 and not any("intruder" in str(b) for b in r.json()["result"])
    finally:
        sidecar.stop()


def test_a_managed_opa_loading_a_signed_bundle_serves_only_the_gateway(tmp_path: Path) -> None:
    """A bundle write-protects its roots only: reads, and writes elsewhere, need the token too."""
    priv, pub = keygen(tmp_path / "keys")
    bundle = tmp_path / "pvegate.tar.gz"
    build(ROOT / "policies", bundle, priv, checks=False)  # policies/ is checked by its own tests
    sidecar = OPASidecar(bundle=bundle, verification_key=pub, decision_logs=False)
    sidecar.start()
    try:
        base = sidecar.url
        assert str(sidecar.api_token) not in " ".join(sidecar.command())  # not readable from /proc/PID/cmdline
        assert httpx.get(f"{base}/v1/data/data/bindings", timeout=5).status_code == 401
        assert httpx.get(f"{base}/v1/policies", timeout=5).status_code == 401
        assert httpx.post(f"{base}/v1/data/pvegate/decision", json={"input": {}}, timeout=5).status_code == 401
        assert httpx.put(f"{base}/v1/data/elsewhere", json={"x": 1}, timeout=5).status_code == 401
        evil = "package elsewhere\n\nx := 1\n"
        assert httpx.put(f"{base}/v1/policies/evil", content=evil, timeout=5).status_code == 401
        forged = {"Authorization": "Bearer not-the-token"}
        assert httpx.get(f"{base}/v1/data/data/bindings", headers=forged, timeout=5).status_code == 401
        assert httpx.get(f"{base}/health?bundles", timeout=5).status_code == 200  # probes need no token
        # control: the gateway's token works, and the bundle's roots stay read-only even for it
        r = httpx.get(f"{base}/v1/data/data/bindings", headers=sidecar.auth_headers, timeout=5)
        assert r.status_code == 200 and r.json()["result"]
        w = httpx.put(f"{base}/v1/data/data/bindings", json=[], headers=sidecar.auth_headers, timeout=5)
        assert w.status_code == 400 and "bundle" in w.text
    finally:
        sidecar.stop()
