"""Soak (slow marker; run by `make bench`): ten minutes of moderate mixed load on a
`pvegate serve` subprocess. No errors, flat memory, `pvegate audit verify` passes.

PVEGATE_SOAK_SECONDS shortens or lengthens it (default 600)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv, make_env
from tests.resilience.helpers import call, client, result_of, text_of
from tests.support import free_port

SECONDS = float(os.environ.get("PVEGATE_SOAK_SECONDS", "600"))
RATE = 25.0  # calls per second: moderate on a shared 2-core machine
PVEGATE = Path(sys.executable).with_name("pvegate")

# (tool, arguments, role, expect_allowed)
MIX: list[tuple[str, dict[str, Any], str, bool]] = [
    ("list_nodes", {}, "operator", True),
    ("get_node_capacity", {"node": "pve1"}, "operator", True),
    ("list_guests", {}, "operator", True),
    ("get_guest_status", {"vmid": 100}, "operator", True),
    ("list_storage", {}, "viewer", True),
    ("vm_stop", {"vmid": 100}, "viewer", False),  # the deny path, decided and audited
]


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@pytest.mark.slow
async def test_soak_no_errors_flat_memory_audit_verifies(rsim: Any, tmp_path: Path) -> None:
    env: DevEnv = make_env(tmp_path / "soak", {"default": rsim}, port=free_port())
    log = open(tmp_path / "gateway.log", "wb")
    proc = subprocess.Popen(
        [str(PVEGATE), "serve", "--config", str(env.config_path)], stdout=log, stderr=log, start_new_session=True
    )
    tokens = {
        role: [env.token(f"soak-{role}-{i}", [role], kind="service", ttl_seconds=7200) for i in range(100)]
        for role in ("operator", "viewer")
    }
    errors: list[str] = []
    sent = 0
    samples: list[tuple[float, int]] = []
    try:
        async with client(env) as http:
            deadline = time.monotonic() + 60
            while True:  # wait for the listener
                try:
                    await http.get(env.url.replace("/mcp", "/healthz"))
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, (tmp_path / "gateway.log").read_text()[-2000:]
                    await asyncio.sleep(0.2)

            async def one(i: int) -> None:
                tool, args, role, allowed = MIX[i % len(MIX)]
                r = await call(http, env.url, tokens[role][i % 100], tool, args)
                if r.status_code != 200:
                    errors.append(f"{tool}: HTTP {r.status_code}")
                    return
                res = result_of(r)
                if bool(res.get("isError")) == allowed:
                    errors.append(f"{tool}: {text_of(res)[:200]}")

            start = time.monotonic()
            tasks: set[asyncio.Task[None]] = set()
            next_sample = start
            while (now := time.monotonic()) < start + SECONDS:
                if now >= next_sample:
                    samples.append((now - start, rss_kb(proc.pid)))
                    next_sample += 15
                t = asyncio.create_task(one(sent))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                sent += 1
                await asyncio.sleep(max(0.0, start + sent / RATE - time.monotonic()))
            await asyncio.gather(*tasks)
            samples.append((time.monotonic() - start, rss_kb(proc.pid)))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()

    print(f"soak: {sent} calls in {SECONDS:.0f}s; RSS samples (s, KiB): {samples}")
    assert errors == [], errors[:10]
    # flat memory: once warm (the first quarter: connection pools, SQLite page cache, target cache,
    # allocator arenas), growth over the rest of the run stays under 10 %
    warm = next((kb for t, kb in samples if t >= SECONDS / 4), samples[0][1])
    assert samples[-1][1] < warm * 1.10, samples
    verify = subprocess.run(
        [str(PVEGATE), "audit", "verify", "--config", str(env.config_path)], capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
