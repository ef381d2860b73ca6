"""A simulator of our own (faults are set on it) and helpers to run gateways with health settings."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import yaml

from gateway.core.config import Config, load
from gateway.dev.devenv import DevEnv, make_env
from tests.support import free_port


@pytest.fixture(scope="package")
def hsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("hsim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def _no_faults(hsim: Any) -> Iterator[None]:
    yield
    hsim.set_faults(latency_ms=0, error_rate=0, drop_rate=0, offline_nodes=[], latency_path=None, error_path=None)


FAST_HEALTH = {
    "opa_probe_interval": 0.5,
    "audit_probe_interval": 0.5,
    "audit_probe_timeout": 2,
    "cluster_probe_interval": 0.5,
}


def health_env(workdir: Path, sim: Any, **extra: Any) -> DevEnv:
    """make_env around `sim` with fast probes, a short Proxmox timeout, and `extra` top-level settings."""
    env = make_env(workdir, {"default": sim}, port=free_port())
    raw = yaml.safe_load(env.config_path.read_text())
    for c in raw["clusters"]:
        c["timeout"] = 1.5
    raw["health"] = {**FAST_HEALTH, **extra.pop("health", {})}
    for key, value in extra.items():  # a mapping merges into the section make_env wrote
        old = raw.get(key)
        raw[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dataclasses.replace(env, config=load(env.config_path))


def with_port(cfg: Config, **changes: Any) -> Config:
    return dataclasses.replace(cfg, port=free_port(), **changes)


def base_url(cfg: Config) -> str:
    return f"https://127.0.0.1:{cfg.port}"


def http_client(env: DevEnv) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=10.0)


async def wait_for(
    http: httpx.AsyncClient, url: str, pred: Callable[[httpx.Response], bool], timeout: float = 10.0
) -> tuple[httpx.Response, float]:
    """Poll `url` until `pred` holds; returns the response and how long it took."""
    started = time.monotonic()
    last: httpx.Response | None = None
    while time.monotonic() - started < timeout:
        last = await http.get(url)
        if pred(last):
            return last, time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"{url} never matched in {timeout}s; last: {last.status_code if last else None} "
        f"{last.text[:600] if last else ''}"
    )


def stop_process(pid: int, timeout: float = 5.0) -> None:
    """SIGSTOP, and wait until the kernel shows the whole process stopped: the stop reaches each
    thread only when it is next scheduled, and an OPA thread already running would still answer."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = Path(f"/proc/{pid}/task")
        states = [_state(t / "status") for t in tasks.iterdir()] if tasks.exists() else ["T"]
        if all(s in ("T", "t") for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


def _state(status: Path) -> str:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        return "T"  # the thread is gone
    return "?"


ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def serving(
    env: DevEnv, log: Path, until: Literal["readyz", "livez"] = "readyz"
) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """`pvegate serve` as its own process (stdout and stderr to `log`), once `until` answers 200: /readyz
    (ready), or /livez for a test of a gateway that may well start unready. An HTTPS client and the base
    URL; terminated on the way out."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "pvegate"), "serve", "--config", str(env.config_path)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        async with http_client(env) as http:
            base = base_url(env.config)
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()[-2000:]
                try:
                    if (await http.get(f"{base}/{until}")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                await asyncio.sleep(0.2)
            yield http, base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
