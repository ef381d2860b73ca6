"""Micro-benchmark of one audit commit on SQLite: sequential appends of one record each
(so every append is one commit), wall and CPU time per commit. docs/performance.md.

    .venv/bin/python scripts/bench_audit_commit.py [N] [--synchronous NORMAL|FULL] [--module FILE]

--module loads AuditLog from another copy of gateway/store/audit.py (e.g. `git show
main~N:gateway/store/audit.py > /tmp/old_audit.py`), to compare two versions in one run.
--postgres measures the PostgreSQL writer instead, against a throw-away server from
tests/pgserver.py (loopback; fsync and synchronous_commit off there, so it measures the
round trips and the head-row lock, not a disk).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.store.audit import AuditLog, AuditRecord

REPO = str(Path(__file__).resolve().parents[1])


def load(module: str | None) -> Any:
    if module is None:
        return AuditLog
    spec = importlib.util.spec_from_file_location("audit_under_test", module)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod.AuditLog


async def pg_location(d: str) -> Any:

    from gateway.store.audit_seal import HeadKey
    from gateway.store.db import PostgresDatabase
    from gateway.store.pgsync import PgLocation
    from gateway.store.schema import upgrade_all

    sys.path.insert(0, REPO)  # tests/pgserver.py
    from tests.pgserver import start_postgres

    server = start_postgres()
    url = await server.create_database("bench_")
    db = PostgresDatabase(url)
    await db.open()
    await upgrade_all(db)
    await db.close()
    HeadKey.create(Path(d) / "audit-head.key")
    return server, PgLocation(url)


async def run(n: int, synchronous: str, rounds: int, log_class: Any, label: str, postgres: bool) -> None:
    walls, cpus = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as d:
            server = None
            if postgres:
                server, where = await pg_location(d)
                log = log_class(where, head_key=Path(d) / "audit-head.key")
                label = "PostgreSQL"
            else:
                log = log_class(Path(d) / "bench.db", synchronous=synchronous)
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
                if server is not None:
                    server.stop()
    print(
        f"{label}: synchronous={synchronous} n={n} x{rounds}: wall {statistics.median(walls):.3f} ms/commit "
        f"(min {min(walls):.3f}), CPU {statistics.median(cpus):.3f} ms/commit"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=2000)
    ap.add_argument("--synchronous", default="NORMAL")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--module", help="another copy of gateway/store/audit.py to measure")
    ap.add_argument("--postgres", action="store_true", help="the PostgreSQL writer (a throw-away local server)")
    a = ap.parse_args()
    logging.disable(logging.WARNING)  # "generated a new audit head key" once per round
    asyncio.run(run(a.n, a.synchronous, a.rounds, load(a.module), a.module or "this tree", a.postgres))


if __name__ == "__main__":
    main()
