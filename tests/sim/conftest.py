"""Fixtures for the simulator's own tests: real subprocess simulators on loopback, real PVE schema."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.harness import SimHandle, start_simulator
from gateway.sim.schema import default_schema_dir


def _need_schema() -> None:
    # the simulator refuses to start without its schema; say why here rather than in a start-up timeout
    for major in ("8.4", "9.1"):
        path = default_schema_dir() / f"pve-{major}-apidata.json.gz"
        if not path.is_file() and not path.with_suffix("").is_file():
            pytest.fail(f"simulator tests need the real PVE schema in {default_schema_dir()}")


@pytest.fixture(scope="session")
def simh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """Shared small-scenario simulator for read-only tests (do not mutate it)."""
    _need_schema()
    h = start_simulator("small", tmp_path_factory.mktemp("sim-ro"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def simw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """A simulator a test module may mutate."""
    _need_schema()
    h = start_simulator("small", tmp_path_factory.mktemp("sim-rw"), ssh=False)
    yield h
    h.stop()


class Api:
    def __init__(self, h: SimHandle, token: str | None) -> None:
        headers = {"Authorization": f"PVEAPIToken={h.tokens[token]}"} if token else {}
        self.base = h.api_url
        self.c = httpx.Client(verify=ssl_ctx(h), headers=headers, timeout=10.0)

    def req(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.c.request(method, self.base + path, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.req("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.req("POST", path, **kw)

    def data(self, path: str, **kw: Any) -> Any:
        r = self.get(path, **kw)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()["data"]


def ssl_ctx(h: SimHandle) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(h.ca_file))


def api(h: SimHandle, token: str | None = "admin") -> Api:
    return Api(h, token)


def schema_dir() -> Path:
    return default_schema_dir()
