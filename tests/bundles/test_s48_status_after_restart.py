"""The revision the gateway reports is the one OPA evaluates: after OPA restarts (an external OPA is
restarted by its platform, behind the running gateway) and cannot activate its bundle (the service
now serves a bundle whose signature fails, or nothing), OPA decides with no policy at all, and
/admin/health and readiness must not go on naming the revision the previous OPA process had.
Real opa, a real signed bundle, a local bundle service on 127.0.0.1."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.bundles import keygen
from gateway.policy.opa_sidecar import find_opa, free_port


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            f = root / self.path.lstrip("/").split("?")[0]
            if not f.is_file():
                self.send_error(404)
                return
            data = f.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _signed_bundle(tmp_path: Path, priv: Path, revision: str) -> Path:
    tree = tmp_path / f"tree-{revision}"
    (tree / "pvegate").mkdir(parents=True)
    (tree / "pvegate" / "p.rego").write_text('package pvegate\n\nimport rego.v1\n\ndecision := {"allow": false}\n')
    (tree / ".manifest").write_text(json.dumps({"revision": revision, "roots": ["pvegate"]}))
    out = tmp_path / f"{revision}.tar.gz"
    cmd = [str(find_opa()), "build", "-b", ".", "-o", str(out), "--signing-key", str(priv), "--signing-alg", "RS256"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=tree, timeout=60)
    return out


def _start(config: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [str(find_opa()), "run", "--server", "--addr", f"127.0.0.1:{port}", "--config-file", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("opa did not start")
        time.sleep(0.05)


def _refreshed(status: PolicyStatus) -> PolicyStatus:
    asyncio.run(status.refresh_once())
    return status


def _wait(cond: Any, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_restarted_opa_that_activated_nothing_has_no_revision(tmp_path: Path, service: tuple[str, Path]) -> None:
    url, served = service
    priv, pub = keygen(tmp_path / "keys")
    good = _signed_bundle(tmp_path, priv, "r1")
    (served / "b.tar.gz").write_bytes(good.read_bytes())
    config = tmp_path / "opa.json"
    config.write_text(
        json.dumps(
            {
                "services": {"svc": {"url": url}},
                "bundles": {
                    "pvegate": {
                        "service": "svc",
                        "resource": "b.tar.gz",
                        "polling": {"min_delay_seconds": 1, "max_delay_seconds": 1},
                        "signing": {"keyid": "k"},
                    }
                },
                "keys": {"k": {"algorithm": "RS256", "key": pub.read_text()}},
                "status": {"prometheus": True},
            }
        )
    )
    port = free_port()
    opa_url = f"http://127.0.0.1:{port}"
    status = PolicyStatus(opa_url, "external")
    proc = _start(config, port)
    try:
        _wait(lambda: _refreshed(status).revision == "pvegate@r1", "the first revision")
    finally:
        proc.kill()
        proc.wait(timeout=10)

    # the platform restarts OPA; the service now serves a bundle whose signature does not verify
    other_priv, _ = keygen(tmp_path / "other-keys")
    (served / "b.tar.gz").write_bytes(_signed_bundle(tmp_path, other_priv, "evil").read_bytes())
    proc = _start(config, port)
    try:
        _wait(lambda: _refreshed(status).bundle_error, "the refused bundle")
        r = httpx.post(f"{opa_url}/v1/data/pvegate/decision", json={"input": {}}, trust_env=False, timeout=5)
        assert "result" not in r.json()  # OPA evaluates no policy at all
        assert status.revision is None and status.revision_known is False
        assert status.as_dict()["bundles"][0]["activated_at"] is None
        assert "pvegate_policy_revision_known 0" in status.prometheus()
    finally:
        proc.kill()
        proc.wait(timeout=10)
