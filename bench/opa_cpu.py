"""Target 3 of issue #16: OPA's CPU per decision, the repository's policy against a trivial one.

Both run as the gateway's managed sidecar runs OPA (OPASidecar: the same flags, GOGC, API
token; a policy directory is loaded partially evaluated with its data), and both are asked
the same golden input over HTTP, one request at a time. CPU is the OPA process's
utime+stime (/proc) over the requests, so other load on the machine changes it little;
the two alternate for `rounds` rounds and the medians are compared. Also reported: OPA's
own eval time (timer_rego_query_eval_ns) p50/p99 at concurrency 1, and `opa bench`
allocations per decision for the golden read, plain and partially evaluated.

    .venv/bin/python bench/opa_cpu.py [--requests 2000] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy import bundles, optimized  # noqa: E402
from gateway.policy.opa_sidecar import OPASidecar, find_opa  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
GOLDEN_READ = "viewer_reads_guest_config"
TRIVIAL_POLICY = 'package pvegate\n\ndecision := {"allow": true, "tool": input.tool.name}\n'


def golden_input(name: str = GOLDEN_READ) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "policies" / "golden" / f"{name}.json").read_text())[name]["input"]
    return doc


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def ask(sidecar: OPASidecar, doc: dict[str, Any], n: int) -> tuple[float, list[int]]:
    """n sequential decisions; (OPA CPU ms per decision, eval ns of each)."""
    assert sidecar.process is not None
    body = json.dumps({"input": doc})
    evals: list[int] = []
    with sidecar.client(timeout=10.0) as client:
        for _ in range(50):  # warm-up: connection, caches
            client.post("/v1/data/pvegate/decision", content=body)
        before = cpu_ticks(sidecar.process.pid)
        for _ in range(n):
            r = client.post("/v1/data/pvegate/decision?metrics=true", content=body)
            r.raise_for_status()
            evals.append(int(r.json()["metrics"]["timer_rego_query_eval_ns"]))
        after = cpu_ticks(sidecar.process.pid)
    return (after - before) * 1000 / HZ / n, evals


def opa_bench_allocs(policy_dir: Path, doc: dict[str, Any]) -> int | None:
    """`opa bench` allocations per decision of data.pvegate.decision on doc."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(doc, f)
        f.flush()
        cmd = [str(find_opa()), "bench", "--benchmem", "--count", "1", "--format", "json"]
        for pattern in optimized.IGNORED:
            cmd += ["--ignore", pattern]
        cmd += ["-d", str(policy_dir), "-i", f.name, "data.pvegate.decision"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    try:
        d = json.loads(done.stdout)
        return int(d["MemAllocs"] // d["N"])
    except (ValueError, KeyError):
        return None


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return float(s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]) if s else float("nan")


def measure(
    requests: int, rounds: int, policies: Path = ROOT / "policies", optimize: bool = True, bundle: Path | None = None
) -> dict[str, Any]:
    doc = golden_input()
    work = Path(tempfile.mkdtemp(prefix="pvegate-opa-cpu-"))
    trivial = work / "trivial"
    trivial.mkdir()
    (trivial / "trivial.rego").write_text(TRIVIAL_POLICY)
    # a bundle (unsigned, e.g. `pvegate bundle build --unsigned [--plain]`) is loaded as built
    repo = OPASidecar(bundle=bundle) if bundle else OPASidecar(policies=(policies,), optimize=optimize)
    triv = OPASidecar(policies=(trivial,), optimize=False)
    out: dict[str, Any] = {"requests": requests, "rounds": [], "input": GOLDEN_READ}
    try:
        repo.start(timeout=60)
        triv.start(timeout=60)
        # (a bundle is loaded as built: its manifest says which it is)
        out["policy_optimized"] = bundles.built_optimized(bundle) if bundle else repo._optimized is not None
        evals: list[int] = []
        for i in range(rounds):
            load = os.getloadavg()[0]
            order = [("policy", repo), ("trivial", triv)]
            if i % 2:
                order.reverse()
            row: dict[str, Any] = {"load_1m": round(load, 2)}
            for name, sc in order:
                ms, ev = ask(sc, doc, requests)
                row[f"{name}_cpu_ms"] = round(ms, 4)
                if name == "policy":
                    evals += ev
            row["ratio"] = round(row["policy_cpu_ms"] / row["trivial_cpu_ms"], 2) if row["trivial_cpu_ms"] else None
            out["rounds"].append(row)
        pol = statistics.median(r["policy_cpu_ms"] for r in out["rounds"])
        tri = statistics.median(r["trivial_cpu_ms"] for r in out["rounds"])
        out.update(
            policy_cpu_ms=pol,
            trivial_cpu_ms=tri,
            ratio=pol / tri if tri else float("inf"),
            eval_p50_us=pct(evals, 50) / 1000,
            eval_p99_us=pct(evals, 99) / 1000,
            eval_samples=len(evals),
        )
        if not bundle:  # `opa bench` of the directory, plain and as the sidecar loaded it
            out["allocs_plain"] = opa_bench_allocs(policies, doc)
            if repo._optimized is not None:
                out["allocs_optimized"] = opa_bench_allocs(repo._optimized, doc)
        return out
    finally:
        repo.stop()
        triv.stop()
        shutil.rmtree(work, ignore_errors=True)  # the trivial policy; a bench run leaves nothing in /tmp


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000, help="decisions per side per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--policies", type=Path, default=ROOT / "policies", help="another policy tree (an A/B)")
    p.add_argument("--plain", action="store_true", help="load the policy directory without partial evaluation")
    p.add_argument("--bundle", type=Path, help="an unsigned bundle to load instead of a policy directory")
    a = p.parse_args()
    started = time.time()
    r = measure(a.requests, a.rounds, a.policies, optimize=not a.plain, bundle=a.bundle)
    if a.json:
        print("OPACPUJSON " + json.dumps(r))
        return 0
    for row in r["rounds"]:
        print(f"round: {row}")
    print(
        f"OPA CPU per decision ({r['input']}, c=1): policy {r['policy_cpu_ms']:.3f} ms, trivial "
        f"{r['trivial_cpu_ms']:.3f} ms, ratio {r['ratio']:.2f}x (median of {len(r['rounds'])} rounds; "
        f"policy partially evaluated: {r['policy_optimized']})"
    )
    print(
        f"OPA eval at c=1: p50 {r['eval_p50_us']:.0f} µs, p99 {r['eval_p99_us']:.0f} µs ({r['eval_samples']} decisions)"
    )
    if "allocs_plain" in r:
        print(f"opa bench allocations per decision: plain {r['allocs_plain']}, optimised {r.get('allocs_optimized')}")
    print(f"({time.time() - started:.0f} s, load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
