"""Micro-benchmark of one audit commit on SQLite: sequential appends of one record each
(so every append is one commit), wall and CPU time per commit. docs/performance.md.

    .venv/bin/python scripts/bench_audit_commit.py [N] [--synchronous NORMAL|FULL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from gateway.store.audit import AuditLog, AuditRecord


async def run(n: int, synchronous: str, rounds: int) -> None:
    walls, cpus = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            log = AuditLog(Path(d) / "bench.db", synchronous=synchronous)
            await log.open()
            try:
                rec = AuditRecord("bench", "decision", "agent", "list_nodes", "default", "allow", {"x": 1})
                for _ in range(50):  # warm up
                    await log.append(rec)
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(n):
                    await log.append(rec)
                walls.append((time.perf_counter() - w0) / n * 1000)
                cpus.append((time.process_time() - c0) / n * 1000)
            finally:
                await log.close()
    print(
        f"synchronous={synchronous} n={n} x{rounds}: wall {statistics.median(walls):.3f} ms/commit "
        f"(min {min(walls):.3f}), CPU {statistics.median(cpus):.3f} ms/commit"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=2000)
    ap.add_argument("--synchronous", default="NORMAL")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    asyncio.run(run(a.n, a.synchronous, a.rounds))


if __name__ == "__main__":
    main()
