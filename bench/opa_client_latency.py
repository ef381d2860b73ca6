"""Which OPA REST client for the hot path: plain httpx, or opa-python-client (aiohttp)?

Standalone: starts the pinned OPA on policies/, sends the same golden decision input
sequentially through each client, interleaved in rounds so machine noise hits both,
and prints p50/p99 per client. Needs `pip install opa-python-client httpx`.

    python bench/opa_client_latency.py [--rounds 5 --per-round 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PARAMS = {"provenance": "true", "metrics": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_httpx(url: str, doc: dict, n: int) -> list[float]:
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as c:
        for _ in range(n):
            t = time.perf_counter()
            r = await c.post("/v1/data/pvegate/decision", params=PARAMS, content=json.dumps({"input": doc}),
                             headers={"content-type": "application/json"})  # fmt: skip
            r.json()
            out.append(time.perf_counter() - t)
    return out


async def run_opa_client(port: int, doc: dict, n: int) -> list[float]:
    from opa_client.opa_async import AsyncOpaClient

    out = []
    async with AsyncOpaClient(host="127.0.0.1", port=port, timeout=2.0) as c:
        for _ in range(n):
            t = time.perf_counter()
            await c.query_rule(doc, "pvegate", "decision", query_params=PARAMS)
            out.append(time.perf_counter() - t)
    return out


async def run_aiohttp(url: str, doc: dict, n: int) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=2.0)) as c:
        for _ in range(n):
            t = time.perf_counter()
            async with c.post("/v1/data/pvegate/decision", params=PARAMS, data=json.dumps({"input": doc}),
                              headers={"content-type": "application/json"}) as r:  # fmt: skip
                await r.json()
            out.append(time.perf_counter() - t)
    return out


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * p))] * 1000


def start_opa() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [str(ROOT / ".tools/bin/opa"), "run", "--server", "--addr", f"127.0.0.1:{port}", "--log-level", "error"]
    cmd += ["--skip-version-check", "--ignore", "*_test.rego", "--ignore", "golden", str(ROOT / "policies")]
    opa = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    return opa, url


async def measure(url: str, port: int, doc: dict, rounds: int, per_round: int) -> None:
    res: dict[str, list[float]] = {"httpx": [], "aiohttp": [], "opa-python-client": []}
    await run_httpx(url, doc, 200)  # warm-up
    await run_aiohttp(url, doc, 200)
    await run_opa_client(port, doc, 200)
    for _ in range(rounds):  # interleaved, so machine noise hits every client alike
        res["httpx"] += await run_httpx(url, doc, per_round)
        res["aiohttp"] += await run_aiohttp(url, doc, per_round)
        res["opa-python-client"] += await run_opa_client(port, doc, per_round)
    print(f"{'client':<20} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, xs in res.items():
        mean = statistics.mean(xs) * 1000
        print(f"{name:<20} {len(xs):>6} {pct(xs, 0.5):>8.3f} {pct(xs, 0.99):>8.3f} {mean:>8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=400)
    ap.add_argument("--golden", type=Path, default=ROOT / "policies/golden/agent_stops_prod_guest_needs_approval.json")
    a = ap.parse_args()
    doc = next(iter(json.loads(a.golden.read_text()).values()))["input"]
    opa, url = start_opa()
    try:
        asyncio.run(measure(url, int(url.rsplit(":", 1)[1]), doc, a.rounds, a.per_round))
    finally:
        opa.terminate()
        opa.wait()


if __name__ == "__main__":
    main()
