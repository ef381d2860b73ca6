"""What metrics and logs add to one allowed tools/call, measured on the calls they make.

An allowed call makes: 4 phase observations (authenticate, decide, dispatch, audit x2),
one decision counter, the in-flight gauge up and down, one latency observation by
outcome, one log-context bind and one `pvegate.calls` log line. This runs exactly those
calls N times (the log line to a file, as `pvegate serve` writes to its stderr).

    .venv/bin/python bench/instrumentation_cost.py [N]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from gateway.observability import logs
from gateway.observability.metrics import Metrics


def per_call(n: int, fmt: str | None) -> float:
    m = Metrics()
    calls = logging.getLogger("pvegate.calls.bench")
    calls.propagate = False
    handler: logging.Handler | None = None
    if fmt is not None:
        handler = logging.FileHandler(Path(tempfile.mkdtemp()) / "bench.log")
        handler.setFormatter(logs.formatter(fmt))
        calls.addHandler(handler)
        calls.setLevel(logging.INFO)
    else:
        calls.setLevel(logging.WARNING)  # the call line filtered out: what a quiet logger costs
    started = time.process_time()  # CPU time: the machine is shared, wall time measures the neighbours
    for _ in range(n):
        logs.bind("0" * 32, "bench-agent", "list_nodes")
        m.calls_in_flight.inc()
        t0 = t = time.perf_counter()
        t = m.observe("authenticate", t)
        t = m.observe("decide", t)
        m.decision["allow"].inc()
        t = m.observe("audit", t)
        t = m.observe("dispatch", t)
        m.observe("audit", t)
        took = time.perf_counter() - t0
        m.calls_in_flight.dec()
        m.call_done("allowed", took)
        calls.info(
            "tools/call %s by %s: %s",
            "list_nodes",
            "bench-agent",
            "allowed",
            extra={"event": "call", "outcome": "allowed", "duration_ms": round(took * 1000, 3)},
        )
    elapsed = time.process_time() - started
    if handler is not None:
        calls.removeHandler(handler)
        handler.close()
    return elapsed / n * 1e6


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    per_call(1000, "json")  # warm up
    for label, fmt in (
        ("metrics only (call log filtered)", None),
        ("+ text log line", "text"),
        ("+ JSON log line", "json"),
    ):
        best = min(per_call(n, fmt) for _ in range(3))
        print(f"{label:36s} {best:6.1f} µs CPU per call (best of 3 x {n})")


if __name__ == "__main__":
    main()
