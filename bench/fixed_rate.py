"""Open-loop fixed-rate load generator (wrk2 is not in Debian; this stands in for it).

Requests are *scheduled* at a fixed rate regardless of how fast answers come back,
and each latency is measured from its scheduled start (so a stalled server is not
hidden by the generator waiting for it: no coordinated omission). Runs in its own
process. Prints one JSON line: {"rate", "sent", "ok", "errors", "p50_us", "p99_us", ...}.

    python bench/fixed_rate.py mcp URL --rate 150 --seconds 20 --tokens FILE --ca CA
    python bench/fixed_rate.py sim URL/nodes --rate 150 --seconds 20 --pve-token FILE --ca CA
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import ssl
import sys
import time
from pathlib import Path

import httpx


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


async def run(a: argparse.Namespace) -> dict[str, object]:
    ctx = ssl.create_default_context(cafile=str(a.ca))
    limits = httpx.Limits(max_connections=a.connections, max_keepalive_connections=a.connections)
    tokens = itertools.cycle(a.token_list) if a.token_list else None
    pve = a.pve_value
    latencies: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(a.connections * 4)  # bounded backlog; beyond it the run is plainly overloaded

    async with httpx.AsyncClient(verify=ctx, limits=limits, timeout=10.0) as http:

        async def one(seq: int, scheduled: float) -> None:
            nonlocal errors
            async with sem:
                try:
                    if a.mode == "mcp":
                        assert tokens is not None
                        body = {
                            "jsonrpc": "2.0",
                            "id": seq,
                            "method": "tools/call",
                            "params": {"name": a.tool, "arguments": {}},
                        }
                        r = await http.post(
                            a.url,
                            json=body,
                            headers={
                                "Authorization": f"Bearer {next(tokens)}",
                                "Accept": "application/json, text/event-stream",
                                "MCP-Protocol-Version": "2025-06-18",
                            },
                        )
                        failed = b'"isError":true' in r.content or b'"error":{' in r.content
                        good = r.status_code == 200 and not failed
                    else:
                        r = await http.get(a.url, headers={"Authorization": f"PVEAPIToken={pve}"})
                        good = r.status_code == 200
                except httpx.HTTPError:
                    good = False
            if good:
                latencies.append(time.perf_counter() - scheduled)
            else:
                errors += 1

        # warm the connection pool outside the measured window
        await asyncio.gather(*(one(-i, time.perf_counter()) for i in range(a.connections)))
        latencies.clear()
        errors = 0
        interval = 1.0 / a.rate
        start = time.perf_counter()
        total = int(a.rate * a.seconds)
        tasks = []
        for seq in range(total):
            scheduled = start + seq * interval
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(seq, scheduled)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    lat = sorted(latencies)
    return {
        "rate": a.rate,
        "achieved_rps": round(len(tasks) / elapsed, 1),
        "sent": total,
        "ok": len(lat),
        "errors": errors,
        "p50_us": round(percentile(lat, 50) * 1e6),
        "p90_us": round(percentile(lat, 90) * 1e6),
        "p99_us": round(percentile(lat, 99) * 1e6),
        "max_us": round((lat[-1] if lat else 0) * 1e6),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["mcp", "sim"])
    p.add_argument("url")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--tokens")
    p.add_argument("--pve-token")
    p.add_argument("--tool", default="list_nodes")
    p.add_argument("--ca", required=True)
    a = p.parse_args()
    a.token_list = [t for t in Path(a.tokens).read_text().split() if t] if a.tokens else []
    a.pve_value = Path(a.pve_token).read_text().strip() if a.pve_token else None
    print("FIXEDJSON " + json.dumps(asyncio.run(run(a))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
