"""`make bench`: pvegate (A) against a bare MCP SDK server (B), side by side in one run.

Everything runs as separate processes on this machine: the simulator, pvegate
(`pvegate serve`, which manages its OPA sidecar), the baseline, and the load
generators (wrk with bench/mcp_call.lua; bench/fixed_rate.py for fixed-rate runs).
Results go to stdout. A recorded run (`make bench` with no options, or --record) also
writes bench/results/latest.json and docs/performance.md between the bench markers; a
quick run (any option, e.g. BENCH_ARGS="--seconds 5") writes only
bench/results/quick-<UTC time>.json (git-ignored) and says so, so a look at the
numbers never overwrites the record.

    .venv/bin/python bench/run.py [--seconds 10] [--levels 1,8,32] [--memory-calls 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.dev.devenv import DevEnv, make_env  # noqa: E402
from gateway.policy.opa_sidecar import free_port  # noqa: E402
from gateway.sim.harness import SimHandle, start_simulator  # noqa: E402

BENCH = ROOT / "bench"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
PY = sys.executable
HZ = os.sysconf("SC_CLK_TCK")
N_PRINCIPALS = 1000  # service principals the load rotates through (quotas are per principal)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- processes ----------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    logfile: Path

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def cpu_ticks(self) -> int:
        """utime+stime of the process and its children still running (pvegate's OPA sidecar)."""
        pids = [self.popen.pid]
        # children are listed per thread: the OPA sidecar is started from a worker thread
        for children in Path(f"/proc/{self.popen.pid}/task").glob("*/children"):
            try:
                pids += [int(p) for p in children.read_text().split()]
            except OSError:
                continue
        total = 0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
        return total

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def spawn(name: str, cmd: list[str], workdir: Path) -> Proc:
    logfile = workdir / f"{name}.log"
    with open(logfile, "ab") as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    return Proc(name, p, logfile)


def wait_https(url: str, ca: Path, proc: Proc, timeout: float = 60.0) -> None:
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited: {proc.logfile.read_text()[-3000:]}")
        try:
            httpx.get(url, verify=ctx, timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(f"{proc.name} not up after {timeout}s")


def start_gateway(name: str, env: DevEnv, workdir: Path) -> Proc:
    gw = spawn(name, [str(ROOT / ".venv" / "bin" / "pvegate"), "serve", "--config", str(env.config_path)], workdir)
    wait_https(env.url.replace("/mcp", "/healthz"), env.ca_file, gw)
    return gw


def write_tokens(env: DevEnv, path: Path) -> Path:
    """N_PRINCIPALS service tokens (role operator), one per line, for wrk to rotate through."""
    subs = (f"bench-svc-{i:04d}" for i in range(N_PRINCIPALS))
    path.write_text("\n".join(env.token(s, ["operator"], kind="service", ttl_seconds=86400) for s in subs) + "\n")
    return path


# --- load ---------------------------------------------------------------------------


def wrk(url: str, script: str, args: list[str], conns: int, seconds: float) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "10s", "--latency"]
    cmd += ["-s", script, url, "--", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=seconds + 60)
    for line in out.stdout.splitlines():
        if line.startswith("WRKJSON "):
            res: dict[str, Any] = json.loads(line[8:])
            res["rps"] = res["requests"] / (res["duration_us"] / 1e6)
            return res
    raise RuntimeError(f"wrk failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")


def fixed_rate(mode: str, url: str, rate: float, seconds: float, ca: Path, auth: list[str]) -> dict[str, Any]:
    cmd = [PY, str(BENCH / "fixed_rate.py"), mode, url, "--rate", f"{rate:.1f}", "--seconds", str(seconds)]
    cmd += ["--ca", str(ca), *auth]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=seconds + 120)
    for line in out.stdout.splitlines():
        if line.startswith("FIXEDJSON "):
            res: dict[str, Any] = json.loads(line[10:])
            return res
    raise RuntimeError(f"fixed_rate failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")


# --- facts --------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    opa = subprocess.run([str(ROOT / ".tools/bin/opa"), "version"], capture_output=True, text=True).stdout
    wrk_v = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0]
    return {
        "cpu": f"{os.cpu_count()} x {cpu}",
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "opa": opa.split("\n")[0].replace("Version: ", ""),
        "wrk": wrk_v.strip(),
        "load_1m_before": f"{os.getloadavg()[0]:.2f}",
    }


def eval_ns_since(db: Path, since: float) -> list[int]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT body FROM audit WHERE kind='decision' AND ts >= ?", (since,)).fetchall()
    finally:
        con.close()
    out = []
    for (body,) in rows:
        ns = json.loads(body).get("eval_ns")
        if isinstance(ns, int):
            out.append(ns)
    return out


def audit_counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {f"{k}:{o}": n for k, o, n in con.execute("SELECT kind, outcome, count(*) FROM audit GROUP BY 1, 2")}
    finally:
        con.close()


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s)) - 1))]


def synthetic_connectors(dest: Path, n: int) -> Path:
    """The real connector files plus n synthetic read tools (a principal that can read sees all)."""
    shutil.copytree(ROOT / "connectors", dest)
    tools = [
        {
            "name": f"synthetic_read_{i:03d}",
            "title": f"Synthetic read {i}",
            "description": "Benchmark-only tool: lists the cluster nodes (generated, not shipped).",
            "domain": "node",
            "effect": "read",
            "scope": "cluster",
            "tags": ["inventory"],
            "pve_api": {"method": "GET", "path": "/nodes"},
            "output": {"list": True, "fields": ["node", "status"]},
        }
        for i in range(n)
    ]
    (dest / "zz-synthetic.yaml").write_text(yaml.safe_dump({"tools": tools}, sort_keys=False))
    return dest


# --- the run ------------------------------------------------------------------------


@dataclass
class Results:
    machine: dict[str, str]
    params: dict[str, Any]
    levels: list[dict[str, Any]] = field(default_factory=list)
    fixed: dict[str, Any] = field(default_factory=dict)
    opa: dict[str, Any] = field(default_factory=dict)
    tools_list: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, int] = field(default_factory=dict)


def run(a: argparse.Namespace) -> Results:
    work = Path(tempfile.mkdtemp(prefix="pvegate-bench-"))
    res = Results(machine(), {k: v for k, v in vars(a).items() if k != "record"})
    procs: list[Proc] = []
    sim: SimHandle | None = None
    try:
        log(f"workdir {work}; starting simulator ({a.scenario})")
        sim = start_simulator(a.scenario, work / "sim")
        env = make_env(work / "gw", {"default": sim}, port=free_port())
        log("starting pvegate (A) and the baseline MCP server (B)")
        gw = start_gateway("gateway", env, work)
        procs.append(gw)
        b_port = free_port()
        tls_dir = env.config.tls
        pve_token = work / "gw" / "secrets" / "default-pve-token"
        base = spawn(
            "baseline",
            [
                *(PY, str(BENCH / "baseline_server.py"), "--port", str(b_port), "--sim-url", sim.api_url),
                *("--token-file", str(pve_token), "--sim-ca", str(sim.ca_file)),
                *("--cert", str(tls_dir.cert), "--key", str(tls_dir.key)),
            ],
            work,
        )
        procs.append(base)
        b_url = f"https://127.0.0.1:{b_port}/mcp"
        wait_https(f"https://127.0.0.1:{b_port}/", env.ca_file, base)  # GET /mcp would open an SSE stream
        tokens = write_tokens(env, work / "tokens.txt")
        script = str(BENCH / "mcp_call.lua")
        a_args, b_args = [str(tokens), a.tool], ["-", a.tool]
        calls_a = 0

        log("warm-up")
        for url, args in ((env.url, a_args), (b_url, b_args)):
            w = wrk(url, script, args, 8, 3)
            calls_a += w["requests"] if url == env.url else 0
            if w["ok"] == 0:
                raise RuntimeError(f"warm-up of {url}: no successful call ({w}); see logs in {work}")

        t_bench = time.time()
        for c in a.levels:
            row: dict[str, Any] = {"c": c}
            # alternate the order per level so neither side always runs on a warmer machine
            order = [("A", env.url, a_args), ("B", b_url, b_args)]
            if c % 2 == 0:
                order.reverse()
            for side, url, args in order:
                server = gw if side == "A" else base
                ticks = server.cpu_ticks()
                row[side] = wrk(url, script, args, c, a.seconds)
                # CPU per call of the server under test (A: gateway + its OPA sidecar): steadier than req/s
                # on a shared machine, since it does not depend on what else competes for the cores
                row[side]["cpu_ms_per_call"] = (server.cpu_ticks() - ticks) * 1000 / HZ / max(1, row[side]["requests"])
                if side == "A":
                    calls_a += row[side]["requests"]
                log(
                    f"c={c} {side}: {row[side]['rps']:.0f} req/s p50 {row[side]['p50_us'] / 1000:.2f} ms "
                    f"p99 {row[side]['p99_us'] / 1000:.2f} ms ok={row[side]['ok']}/{row[side]['requests']}"
                )
            row["sim"] = wrk(f"{sim.api_url}/nodes", str(BENCH / "sim_get.lua"), [str(pve_token)], c, a.seconds)
            row["ratio"] = row["A"]["rps"] / row["B"]["rps"] if row["B"]["rps"] else float("inf")
            res.levels.append(row)

        peak = max(r["A"]["rps"] for r in res.levels)
        rate = peak / 2
        log(
            f"fixed rate {rate:.0f}/s (half of A's peak {peak:.0f}/s) for {a.fixed_seconds}s: "
            "A, then the simulator direct"
        )
        fa = fixed_rate("mcp", env.url, rate, a.fixed_seconds, env.ca_file, ["--tokens", str(tokens), "--tool", a.tool])
        calls_a += fa["sent"]
        fs = fixed_rate(
            "sim", f"{sim.api_url}/nodes", rate, a.fixed_seconds, sim.ca_file, ["--pve-token", str(pve_token)]
        )
        res.fixed = {
            "rate": rate,
            "A": fa,
            "sim": fs,
            "added_p50_us": fa["p50_us"] - fs["p50_us"],
            "added_p99_us": fa["p99_us"] - fs["p99_us"],
        }
        log(f"fixed: A p99 {fa['p99_us'] / 1000:.2f} ms, direct p99 {fs['p99_us'] / 1000:.2f} ms")

        evals = eval_ns_since(env.config.audit_path, t_bench)
        res.opa = {
            "decisions": len(evals),
            "p50_us": pct(evals, 50) / 1000,
            "p99_us": pct(evals, 99) / 1000,
            "mean_us": statistics.fmean(evals) / 1000 if evals else float("nan"),
        }
        log(f"OPA eval over {len(evals)} decisions: p99 {res.opa['p99_us']:.0f} µs")

        if a.memory_from:  # reuse the long memory run of an earlier invocation, and say so
            res.memory = json.loads(Path(a.memory_from).read_text())["memory"]
            res.memory["source"] = f"{a.memory_from}, recorded {res.memory.get('recorded', 'earlier')}"
        else:
            res.memory = memory_growth(gw, env, tokens, script, a, calls_a)
            res.memory["recorded"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        base.stop()
        gw.stop()  # first: calls wrk left in flight still write their result record
        res.audit = audit_counts(env.config.audit_path)
        verify = subprocess.run(
            [str(ROOT / ".venv/bin/pvegate"), "audit", "verify", "--config", str(env.config_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        res.memory["audit_verify"] = (verify.returncode, (verify.stdout + verify.stderr).strip()[-300:])

        res.tools_list = tools_list_bench(sim, work, a)
        return res
    finally:
        for p in reversed(procs):
            p.stop()
        if sim is not None:
            sim.stop()
        log(f"logs kept in {work}")


def memory_growth(
    gw: Proc, env: DevEnv, tokens: Path, script: str, a: argparse.Namespace, calls: int
) -> dict[str, Any]:
    """Drive A with wrk in chunks until the gateway has served a.memory_calls calls; sample VmRSS."""
    samples: list[tuple[int, int]] = [(calls, gw.rss_kb())]
    errors = 0
    log(f"memory: driving pvegate to {a.memory_calls} calls (now {calls}), RSS {samples[0][1] / 1024:.1f} MiB")
    while calls < a.memory_calls:
        w = wrk(env.url, script, [str(tokens), a.tool], a.memory_conns, a.memory_chunk)
        calls += w["requests"]
        errors += w["requests"] - w["ok"]
        samples.append((calls, gw.rss_kb()))
        log(f"memory: {calls} calls, RSS {samples[-1][1] / 1024:.1f} MiB, {w['rps']:.0f} req/s")
    at_20k = next((s for s in samples if s[0] >= a.memory_base), samples[0])
    final = samples[-1]
    return {
        "samples": samples,
        "base_calls": at_20k[0],
        "base_rss_kb": at_20k[1],
        "final_calls": final[0],
        "final_rss_kb": final[1],
        "growth_pct": (final[1] - at_20k[1]) / at_20k[1] * 100,
        "failed_calls": errors,
    }


def tools_list_bench(sim: SimHandle, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Both ways a listing is answered: reused within tools_list_cache_seconds, and asked of OPA each time."""
    log(f"tools/list with {a.synthetic_tools} synthetic tools added to the catalog")
    conn_dir = synthetic_connectors(work / "connectors-500", a.synthetic_tools)
    out: dict[str, Any] = {}
    for mode, ttl in (("reused", 10.0), ("fresh", 0.0)):
        out[mode] = _tools_list_run(sim, work, a, conn_dir, mode, ttl)
    return out


def _tools_list_run(
    sim: SimHandle, work: Path, a: argparse.Namespace, conn_dir: Path, mode: str, ttl: float
) -> dict[str, Any]:
    extra = {"connectors_dir": str(conn_dir), "tools_list_cache_seconds": ttl}
    env = make_env(work / f"gw-500-{mode}", {"default": sim}, port=free_port(), extra=extra)
    gw = start_gateway(f"gateway-500-{mode}", env, work)
    try:
        token = env.token("bench-lister", ["operator"], kind="service", ttl_seconds=3600)
        ctx = ssl.create_default_context(cafile=str(env.ca_file))
        r = httpx.post(
            env.url,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={
                "Authorization": f"Bearer {token}",
                "MCP-Protocol-Version": "2025-06-18",
                "Accept": "application/json, text/event-stream",
            },
            verify=ctx,
            timeout=10,
        )
        listed = r.json()["result"]["tools"]
        synthetic = sum(1 for t in listed if t["name"].startswith("synthetic_read_"))
        tf = work / f"lister-token-{mode}.txt"
        tf.write_text(token + "\n")
        out: dict[str, Any] = {"visible": len(listed), "synthetic_visible": synthetic, "bytes": len(r.content)}
        for c in (1, 4):
            w = wrk(env.url, str(BENCH / "mcp_call.lua"), [str(tf), "@list"], c, a.seconds)
            out[f"c{c}"] = w
            log(
                f"tools/list ({mode}) c={c}: {w['rps']:.0f}/s p50 {w['p50_us'] / 1000:.2f} ms "
                f"p99 {w['p99_us'] / 1000:.2f} ms"
            )
        return out
    finally:
        gw.stop()


# --- report -------------------------------------------------------------------------


def ms(us: float) -> str:
    return f"{us / 1000:.2f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def report(r: Results, command: str) -> str:
    m = r.machine
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — `{command}`",
        "",
        f"Machine: {m['cpu']}, {m['memory']} RAM, Linux {m['kernel']}, Python {m['python']}, OPA {m['opa']}, "
        f"{m['wrk']}; 1-minute load average before the run: {m['load_1m_before']}. No CPU pinning: the load "
        "generator, pvegate, its OPA sidecar, the baseline and the simulator share all cores.",
        "",
        "| concurrency | A req/s | A p50 ms | A p99 ms | B req/s | B p50 ms | B p99 ms | A/B throughput | "
        "A CPU ms/call | B CPU ms/call | direct sim req/s | direct p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r.levels:
        A, B, S = row["A"], row["B"], row["sim"]
        lines.append(
            f"| {row['c']} | {A['rps']:.0f} | {ms(A['p50_us'])} | {ms(A['p99_us'])} | {B['rps']:.0f} | "
            f"{ms(B['p50_us'])} | {ms(B['p99_us'])} | {row['ratio']:.2f}x | {A['cpu_ms_per_call']:.2f} | "
            f"{B['cpu_ms_per_call']:.2f} | {S['rps']:.0f} | {ms(S['p99_us'])} |"
        )
    errs = [(row["c"], side, row[side]["requests"] - row[side]["ok"]) for row in r.levels for side in ("A", "B")]
    bad = [e for e in errs if e[2]]
    lines += [
        "",
        "Failed calls during the throughput runs: " + (", ".join(f"{s}@c={c}: {n}" for c, s, n in bad) or "none") + ".",
    ]
    f = r.fixed
    mem = r.memory
    tl = r.tools_list
    min_ratio = min(row["ratio"] for row in r.levels)
    lines += [
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| A throughput ≥ 1.5 x B at every concurrency | min A/B = {min_ratio:.2f}x | {verdict(min_ratio >= 1.5)} |",
        "| latency added over a direct simulator call ≤ 5 ms p99 at half A's peak rate "
        f"({f['rate']:.0f}/s, open loop) | "
        f"A p99 {ms(f['A']['p99_us'])} ms - direct p99 {ms(f['sim']['p99_us'])} ms = {ms(f['added_p99_us'])} ms "
        f"(p50 added {ms(f['added_p50_us'])} ms; A errors {f['A']['errors']}) | {verdict(f['added_p99_us'] <= 5000)} |",
        f"| OPA evaluation ≤ 1 ms p99 (OPA's timer_rego_query_eval_ns, {r.opa['decisions']} decisions) | "
        f"p50 {r.opa['p50_us']:.0f} µs, p99 {r.opa['p99_us']:.0f} µs | {verdict(r.opa['p99_us'] <= 1000)} |",
        *(
            f"| tools/list with {r.params['synthetic_tools']} connector tools loaded ≤ 20 ms, {label} | "
            f"{tl[mode].get('visible')} tools listed ({tl[mode].get('bytes', 0) // 1024} KiB); "
            f"c=1 p50 {ms(tl[mode]['c1']['p50_us'])} ms, p99 {ms(tl[mode]['c1']['p99_us'])} ms | "
            f"{verdict(tl[mode]['c1']['p99_us'] <= 20000)} |"
            for mode, label in (
                ("reused", "answer reused (`tools_list_cache_seconds: 10`, the default)"),
                ("fresh", "every listing asks OPA (`tools_list_cache_seconds: 0`)"),
            )
        ),
        f"| RSS growth < 10 % between call {mem['base_calls']} and call {mem['final_calls']} | "
        f"{mem['base_rss_kb'] / 1024:.1f} → {mem['final_rss_kb'] / 1024:.1f} MiB ({mem['growth_pct']:+.1f} %), "
        f"{mem['failed_calls']} failed calls | {verdict(mem['growth_pct'] < 10)} |",
        "",
        f"`pvegate audit verify` after the run: exit {mem['audit_verify'][0]} ({mem['audit_verify'][1]!s}).",
        "",
        "Audit records written: " + ", ".join(f"{k} {v}" for k, v in sorted(r.audit.items())) + ".",
        "",
        "RSS samples (calls served, MiB): " + ", ".join(f"{c}: {kb / 1024:.1f}" for c, kb in mem["samples"]),
        *(["", f"The memory-growth row comes from an earlier run: {mem['source']}."] if mem.get("source") else []),
    ]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text() if DOC.exists() else f"# Performance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1] if END in rest else ""
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def outputs(argv: Sequence[str], record: bool, stamp: str) -> tuple[Path, bool]:
    """(where the raw results go, whether docs/performance.md is updated) for this command line."""
    if record or not argv:
        return BENCH / "results" / "latest.json", True
    return BENCH / "results" / f"quick-{stamp}.json", False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10, help="per wrk run")
    p.add_argument("--levels", default="1,8,32", help="wrk connection counts, comma-separated")
    p.add_argument("--scenario", default="default", help="simulator scenario")
    p.add_argument("--tool", default="list_nodes", help="the tool every benchmarked call runs")
    p.add_argument("--fixed-seconds", type=float, default=30, help="length of each fixed-rate run")
    p.add_argument("--memory-calls", type=int, default=200_000, help="calls in the memory-growth run")
    p.add_argument("--memory-base", type=int, default=20_000, help="calls before the memory baseline is taken")
    p.add_argument("--memory-conns", type=int, default=16, help="connections in the memory-growth run")
    p.add_argument("--memory-chunk", type=float, default=20, help="seconds between RSS samples")
    p.add_argument("--synthetic-tools", type=int, default=500, help="catalog size for the tools/list benchmark")
    p.add_argument("--memory-from", help="take the memory-growth result from this latest.json instead of re-running it")
    p.add_argument(
        "--record",
        action="store_true",
        help="record a run with options: write bench/results/latest.json and docs/performance.md",
    )
    a = p.parse_args()
    a.levels = [int(x) for x in a.levels.split(",")]
    if shutil.which("wrk") is None:
        print("wrk is not installed: apt-get install -y wrk (make bench does this when run as root)", file=sys.stderr)
        return 2
    argv = [x for x in sys.argv[1:] if x != "--record"]
    raw, update_doc = outputs(argv, a.record, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    if not update_doc:
        log(f"quick run (options given): results go to {raw.relative_to(ROOT)}; the record is left alone "
            "(pass --record to record this run)")  # fmt: skip
    command = "make bench" if not argv else "python bench/run.py " + " ".join(sys.argv[1:])
    r = run(a)
    text = report(r, command)
    print("\n" + text + "\n")
    raw.parent.mkdir(exist_ok=True)
    raw.write_text(json.dumps(r.__dict__, indent=1, default=str))
    log(f"wrote {raw.relative_to(ROOT)}")
    if update_doc:
        write_doc(text)
        log(f"wrote {DOC.relative_to(ROOT)}")
    else:
        log(f"not recorded: {DOC.relative_to(ROOT)} and bench/results/latest.json are unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
