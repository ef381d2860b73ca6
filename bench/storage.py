"""`make bench`, storage rows: the full path on SQLite against PostgreSQL, one replica against two.

Side by side in one run, on this machine: a simulator, a real PostgreSQL (tests/pgserver.py,
with fsync and synchronous_commit ON, as production runs it) and, one configuration after the
other, `pvegate serve` processes (each managing its OPA sidecar):

  sqlite x1      one gateway, state in its SQLite file (the default)
  postgresql x1  one gateway, state in PostgreSQL (audit chain, approvals, quota counters, keys)
  postgresql x2  two replicas on the same PostgreSQL, the load split evenly between them (two
                 wrk processes, one per replica, standing for a load balancer)

Every call is a full tools/call of a read (list_nodes): JWT, quota reservation, one OPA query,
the decision record (durable before the simulator hears of it), the Proxmox call, the result
record. CPU per call counts the gateways, their OPA sidecars and PostgreSQL's processes (the
load generator and the simulator are not counted): what a call costs the deployment.

    .venv/bin/python bench/storage.py [--seconds 10] [--conns 16] [--record]

--record (or `make bench`) writes the table into docs/performance.md between the
bench-storage markers; otherwise results are printed only.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import HZ, Proc, log, machine, start_gateway, write_tokens, wrk  # noqa: E402

from gateway.core.config import load  # noqa: E402
from gateway.dev.devenv import DevEnv, make_env  # noqa: E402
from gateway.policy.opa_sidecar import free_port  # noqa: E402
from gateway.sim.harness import start_simulator  # noqa: E402
from gateway.store.audit_seal import HeadKey  # noqa: E402
from tests.pgserver import PostgresServer, start_postgres  # noqa: E402

DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench-storage:begin -->", "<!-- bench-storage:end -->"
TOOL = "list_nodes"


def tree_ticks(pid: int) -> int:
    """utime+stime of a process and its direct children (a gateway's OPA; PostgreSQL's backends)."""
    pids = [pid]
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids += [int(p) for p in children.read_text().split()]
        except OSError:
            continue
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def replica_env(base: DevEnv, name: str, dsn: str | None) -> DevEnv:
    """base's secrets and TLS on a port of its own; dsn None: SQLite in its own state folder."""
    raw = yaml.safe_load(base.config_path.read_text())
    port = free_port()
    raw["listen"]["port"] = port
    raw["public_url"] = f"https://127.0.0.1:{port}"
    raw["state_dir"] = str(base.workdir / f"state-{name}")
    if dsn is None:
        raw["audit"] = {"path": str(base.workdir / f"state-{name}" / "audit.db")}
    else:
        raw["audit"] = {"head_key_file": str(base.workdir / "audit-head.key")}  # one chain, one key
        raw["storage"] = {"url": dsn, "pool_max_size": 10}
    path = base.workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return DevEnv(base.workdir, path, load(path), base.ca_file, f"https://127.0.0.1:{port}/mcp", base.jwt_secret)


def db_upgrade(env: DevEnv) -> None:
    import subprocess

    r = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "pvegate"), "db", "upgrade", "--config", str(env.config_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise RuntimeError(f"pvegate db upgrade failed: {r.stderr.strip()}")


def measure(
    label: str, gws: list[tuple[Proc, DevEnv]], pg: PostgresServer | None, tokens: Path, a: argparse.Namespace
) -> dict[str, Any]:
    """wrk against every replica at once (conns split evenly); throughput and CPU per call."""
    script = str(ROOT / "bench" / "mcp_call.lua")
    for _, env in gws:  # warm-up: connections, OPA, the database's caches
        wrk(env.url, script, [str(tokens), TOOL], 4, 2)
    pids = [gw.popen.pid for gw, _ in gws] + ([pg.proc.pid] if pg else [])
    before = {p: tree_ticks(p) for p in pids}
    t0 = time.monotonic()
    conns = max(1, a.conns // len(gws))
    with concurrent.futures.ThreadPoolExecutor(len(gws)) as pool:
        runs = list(pool.map(lambda e: wrk(e.url, script, [str(tokens), TOOL], conns, a.seconds), [e for _, e in gws]))
    wall = time.monotonic() - t0
    ticks = {p: tree_ticks(p) - before[p] for p in pids}
    calls = sum(r["requests"] for r in runs)
    ok = sum(r["ok"] for r in runs)
    gw_ms = sum(ticks[gw.popen.pid] for gw, _ in gws) * 1000 / HZ / max(1, calls)
    pg_ms = (ticks[pg.proc.pid] * 1000 / HZ / max(1, calls)) if pg else 0.0
    row = {
        "label": label,
        "replicas": len(gws),
        "calls": calls,
        "ok": ok,
        "rps": sum(r["rps"] for r in runs),
        "p50_ms": max(r["p50_us"] for r in runs) / 1000,
        "p99_ms": max(r["p99_us"] for r in runs) / 1000,
        "gw_cpu_ms": gw_ms,
        "pg_cpu_ms": pg_ms,
        "cpu_ms": gw_ms + pg_ms,
        "wall_s": wall,
    }
    log(
        f"{label}: {row['rps']:.0f} calls/s, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
        f"CPU {row['cpu_ms']:.2f} ms/call (gateways+OPA {gw_ms:.2f}, PostgreSQL {pg_ms:.2f}), ok {ok}/{calls}"
    )
    return row


def run(a: argparse.Namespace) -> tuple[dict[str, str], list[dict[str, Any]]]:
    work = Path(tempfile.mkdtemp(prefix="pvegate-bench-storage-"))
    facts = machine()
    procs: list[Proc] = []
    sim = pg = None
    rows: list[dict[str, Any]] = []
    try:
        log(f"workdir {work}; starting the simulator and PostgreSQL (fsync, synchronous_commit on)")
        sim = start_simulator(a.scenario, work / "sim", ssh=False)
        pg = start_postgres(durable=True)
        dsn = asyncio.run(pg.create_database("bench_"))
        base = make_env(work / "gw", {"default": sim}, port=free_port())
        HeadKey.create(base.workdir / "audit-head.key")
        tokens = write_tokens(base, work / "tokens.txt")

        def start(names: list[str], url: str | None) -> list[tuple[Proc, DevEnv]]:
            envs = [replica_env(base, n, url) for n in names]
            if url is not None:
                db_upgrade(envs[0])
            out = []
            for n, env in zip(names, envs, strict=True):
                gw = start_gateway(n, env, work)
                procs.append(gw)
                out.append((gw, env))
            return out

        def stop(gws: list[tuple[Proc, DevEnv]]) -> None:
            for gw, _ in gws:
                gw.stop()
                procs.remove(gw)

        for label, names, url, server in (
            ("sqlite x1", ["sqlite"], None, None),
            ("postgresql x1", ["pg-1"], dsn, pg),
            ("postgresql x2", ["pg-a", "pg-b"], dsn, pg),
        ):
            log(f"starting {label}")
            gws = start(names, url)
            try:
                rows.append(measure(label, gws, server, tokens, a))
            finally:
                stop(gws)
        return facts, rows
    finally:
        for p in reversed(procs):
            p.stop()
        if sim is not None:
            sim.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(facts: dict[str, str], rows: list[dict[str, Any]], a: argparse.Namespace, load_before: str) -> str:
    by = {r["label"]: r for r in rows}
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — `python bench/storage.py --seconds "
        f"{a.seconds:g} --conns {a.conns}`; {facts['cpu']}, Linux {facts['kernel']}; 1-minute load average "
        f"before the run: {load_before} (other work shared the two cores: read the ratios, not the absolutes).",
        "",
        "| configuration | calls/s | p50 ms | p99 ms | CPU ms/call (all) | of which gateways + OPA | "
        "of which PostgreSQL | failed calls |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['cpu_ms']:.2f} | "
            f"{r['gw_cpu_ms']:.2f} | {r['pg_cpu_ms']:.2f} | {r['calls'] - r['ok']} |"
        )
    if {"sqlite x1", "postgresql x1", "postgresql x2"} <= by.keys():
        s, p1, p2 = by["sqlite x1"], by["postgresql x1"], by["postgresql x2"]
        lines += [
            "",
            f"PostgreSQL against SQLite (one gateway): {p1['rps'] / s['rps']:.2f}x the throughput, "
            f"{p1['cpu_ms'] / s['cpu_ms']:.2f}x the CPU per call. Two replicas against one (PostgreSQL): "
            f"{p2['rps'] / p1['rps']:.2f}x the throughput.",
        ]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1] if END in rest else ""
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10, help="per configuration")
    p.add_argument("--conns", type=int, default=16, help="wrk connections in all (split over the replicas)")
    p.add_argument("--scenario", default="default", help="simulator scenario")
    p.add_argument("--record", action="store_true", help="write the table into docs/performance.md")
    a = p.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk (make bench does this when run as root)", file=sys.stderr)
        return 2
    load_before = f"{os.getloadavg()[0]:.2f}"
    facts, rows = run(a)
    text = report(facts, rows, a, load_before)
    print("\n" + text + "\n")
    if a.record:
        write_doc(text)
        log(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
