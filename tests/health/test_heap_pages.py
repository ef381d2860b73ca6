"""`pvegate serve` keeps the heap pages a large response frees (gateway/server.py: keep_freed_heap).

A cached tools/list over a 659-tool catalog is ~0.55 MiB built and copied a few times per request; glibc gave
the freed top of its heap back to the kernel after each one, so every listing faulted ~3 MiB of pages back in
(~800 minor faults per listing, 2.5x its CPU: docs/performance.md). Counted here from /proc, not timed."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import synthetic_connectors
from gateway.server import keep_freed_heap
from tests.health.conftest import health_env, serving

LISTINGS = 20


def _serve_pid(config_path: Path) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and str(config_path).encode() in args:
            return int(entry.name)
    raise AssertionError(f"no pvegate serve for {config_path}")


def _minor_faults(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[7])  # minflt: the 10th field of stat, the 8th after the command name


async def test_serve_keeps_the_pages_a_large_listing_frees(hsim: Any, tmp_path: Path) -> None:
    connectors = synthetic_connectors(tmp_path / "connectors", 500)
    env = health_env(tmp_path / "gw", hsim, connectors_dir=str(connectors), tools_list_cache_seconds=300)
    token = env.token("heap-lister", ["operator"], kind="service")
    headers = {
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": "2025-06-18",
        "Accept": "application/json, text/event-stream",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with serving(env, tmp_path / "serve.log") as (http, _base):
        pid = _serve_pid(env.config_path)
        for _ in range(3):  # the first asks OPA and encodes the catalog's definitions once
            r = await http.post(env.url, json=body, headers=headers)
            assert r.status_code == 200 and len(r.json()["result"]["tools"]) > 600, r.text[:300]
        before = _minor_faults(pid)
        for _ in range(LISTINGS):
            r = await http.post(env.url, json=body, headers=headers)
            assert r.status_code == 200 and len(r.content) > 400_000
        per_listing = (_minor_faults(pid) - before) / LISTINGS
    # ~800 with the pages given back after each listing; a handful otherwise (the audit's and TLS's own)
    assert per_listing < 100, per_listing


def test_an_operators_malloc_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        with monkeypatch.context() as m:
            m.setenv(name, "glibc.malloc.trim_threshold=1" if name == "GLIBC_TUNABLES" else "1")
            assert keep_freed_heap() is False
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    glibc = platform.libc_ver()[0] == "glibc"
    with monkeypatch.context() as m:  # GLIBC_TUNABLES without a malloc setting leaves malloc ours to set
        m.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        assert keep_freed_heap() is glibc
    assert keep_freed_heap() is glibc  # set here, in the test's own process
