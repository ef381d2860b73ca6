"""Join run_tail.py's traces: where A's slowest calls spent their time.

    .venv/bin/python bench/tail/analyse.py OUT_DIR ROUND

A client record (scheduled time, latency, token) is matched to the gateway's record of the same
principal that started inside it; each band of calls (by client latency) prints its mean time
before the handler, in it, after it, per phase, and the event-loop stalls during it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    d, rnd = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "0"
    client = [json.loads(line) for line in (d / f"client_A{rnd}.jsonl").open()]
    gateway = [json.loads(line) for line in (d / "gw_trace.jsonl").open()]
    lags = [tuple(map(float, line.split())) for line in (d / "lag.txt").open()] if (d / "lag.txt").exists() else []
    by_sub: dict[str, list[dict[str, Any]]] = {}
    for g in gateway:
        sub = next((v for k, v in g["ph"] if k == "sub"), None)
        if sub:
            by_sub.setdefault(sub, []).append(g)
    for calls in by_sub.values():
        calls.sort(key=lambda g: g["t0"])
    rows: list[dict[str, float]] = []
    for c in client:
        start, end = c["t"], c["t"] + c["ms"] / 1000
        sub = f"bench-svc-{c['tok']:04d}"
        match = next((g for g in by_sub.get(sub, []) if start - 0.01 <= g["t0"] <= end), None)
        if match is None:
            continue
        phases: dict[str, float] = {}
        for k, v in match["ph"]:
            if k != "sub":
                phases[k] = phases.get(k, 0) + v
        pre = (match["t0"] - start) * 1000
        during = [x for x in lags if start <= x[0] <= end]
        rows.append(
            {
                "ms": c["ms"],
                "pre": pre,
                "handler": match["ms"],
                "post": c["ms"] - pre - match["ms"],
                "stalled": sum(x[1] for x in during),
                "stalled_cpu": sum(x[2] for x in during),
                **phases,
            }
        )
    print("matched", len(rows), "of", len(client))
    rows.sort(key=lambda r: r["ms"])
    n = len(rows)
    keys = ["ms", "pre", "handler", "post", "stalled", "stalled_cpu", "authenticate", "decide", "audit", "dispatch"]
    bands = {
        "fast half": rows[: n // 2],
        "p50 band": rows[int(n * 0.49) : int(n * 0.51)],
        "p98-99.5": rows[int(n * 0.98) : int(n * 0.995)],
        "top 1%": rows[int(n * 0.99) :],
    }
    for name, sel in bands.items():
        if sel:
            means = " ".join(f"{k}={statistics.mean(r.get(k, 0) for r in sel):.2f}" for k in keys)
            print(f"{name:10}", len(sel), means)
    stalled, cpu = round(sum(x[1] for x in lags)), round(sum(x[2] for x in lags))
    print("stalls", len(lags), "ms in all", stalled, "loop CPU in them", cpu)


if __name__ == "__main__":
    main()
