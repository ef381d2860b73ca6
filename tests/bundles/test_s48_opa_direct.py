"""The gateway's questions to an external OPA go to that OPA, never through an HTTP proxy the
environment names (HTTP_PROXY / HTTPS_PROXY / ALL_PROXY, common on a corporate host).

Through a proxy, "does this OPA answer without a token?" is answered by the proxy: a filtering proxy's
403 (or a 502 for a host it cannot reach) read as "it wants a token", so a gateway would start against,
and keep deciding with, an OPA open to anyone; and the bundle status (revision, errors) would be the
proxy's word. The decision client (aiohttp) never used the environment's proxy. Real opa; the
"proxy" is a local server that refuses everything."""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.opa_guard import opa_is_open, opa_is_open_async
from gateway.policy.opa_sidecar import find_opa, free_port


@pytest.fixture
def open_opa(tmp_path: Path) -> Iterator[str]:
    """A real OPA on 127.0.0.1 with no authentication: open to anyone."""
    (tmp_path / "p.rego").write_text("package pvegate\n\nimport rego.v1\n\ndecision := {}\n")
    port = free_port()
    proc = subprocess.Popen(
        [str(find_opa()), "run", "--server", "--addr", f"127.0.0.1:{port}", str(tmp_path / "p.rego")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "opa did not start"
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def refusing_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The environment's proxy: answers 403 to every request, and remembers what it was asked."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def test_an_open_opa_is_found_open_whatever_proxy_the_environment_names(
    open_opa: str, refusing_proxy: list[str]
) -> None:
    assert opa_is_open(open_opa) is True
    assert asyncio.run(opa_is_open_async(open_opa)) is True
    assert refusing_proxy == []


def test_the_bundle_status_is_read_from_opa_itself(open_opa: str, refusing_proxy: list[str]) -> None:
    status = PolicyStatus(open_opa, "external")
    asyncio.run(status.refresh_once())
    assert status.reachable is True and status.problem is None
    assert refusing_proxy == []
