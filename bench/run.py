"""`make bench`: pvegate (A) against a bare MCP SDK server (B), side by side in one run.

Everything runs as separate processes on this machine: the simulator, pvegate
(`pvegate serve`, which manages its OPA sidecar), the baseline, and the load
generators (wrk with bench/mcp_call.lua; bench/fixed_rate.py for fixed-rate runs).
A third server, A0 (A with its decision a constant), runs beside both at c=8 and at the
fixed rate, so the report shows how much of A's gap to B is the policy's evaluation.
Results go to stdout. A recorded run (`make bench` with no options, or --record) also
writes bench/results/latest.json and docs/performance.md between the bench markers; a
quick run (any option, e.g. BENCH_ARGS="--seconds 5") writes only
bench/results/quick-<UTC time>.json (git-ignored) and says so, so a look at the
numbers never overwrites the record.

    .venv/bin/python bench/run.py [--seconds 10] [--levels 1,8,32] [--memory-calls 200000]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
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
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.dev.devenv import DevEnv, make_env, synthetic_connectors  # noqa: E402
from gateway.policy.opa_sidecar import free_port  # noqa: E402
from gateway.sim.harness import SimHandle, start_simulator  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opa_cpu  # noqa: E402

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

    def cpu_ticks(self, children: bool = True) -> int:
        """utime+stime of the process and (children=True) its children still running (pvegate's OPA sidecar)."""
        pids = [self.popen.pid]
        if not children:
            return _ticks(pids)
        # children are listed per thread: the OPA sidecar is started from a worker thread
        for listing in Path(f"/proc/{self.popen.pid}/task").glob("*/children"):
            try:
                pids += [int(p) for p in listing.read_text().split()]
            except OSError:
                continue
        return _ticks(pids)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def _ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total


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


def phase_sums(url: str, ca: Path, token_file: Path) -> dict[str, tuple[float, int, int]]:
    """(sum of seconds, count, count within 5 ms) of each phase of pvegate_phase_seconds, from the
    gateway's /metrics."""
    r = httpx.get(
        url,
        verify=ssl.create_default_context(cafile=str(ca)),
        timeout=10.0,
        headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
    )
    r.raise_for_status()
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    within: dict[str, int] = {}
    for family in text_string_to_metric_families(r.text):
        if family.name != "pvegate_phase_seconds":
            continue
        for smp in family.samples:
            ph = smp.labels.get("phase", "")
            if smp.name.endswith("_sum"):
                sums[ph] = smp.value
            elif smp.name.endswith("_count"):
                counts[ph] = int(smp.value)
            elif smp.name.endswith("_bucket") and float(smp.labels.get("le", "0")) == 0.005:
                within[ph] = int(smp.value)
    return {ph: (sums.get(ph, 0.0), counts[ph], within.get(ph, 0)) for ph in counts}


def disk_sync_latency(directory: Path, n: int = 500) -> dict[str, float]:
    """fdatasync of a 4 KiB write in the audit's directory, n times ~2 ms apart: the floor under every
    call's latency (a call waits for two audit commits: its decision, durable before Proxmox is asked,
    and its result), which is the disk's and the kernel's, not the gateway's."""
    fd, name = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    lat: list[float] = []
    try:
        for i in range(n):
            os.pwrite(fd, os.urandom(4096), (i % 64) * 4096)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1000)
            time.sleep(0.002)
    finally:
        os.close(fd)
        os.unlink(name)
    lat.sort()
    return {"n": n, "p50_ms": lat[n // 2], "p99_ms": lat[min(n - 1, int(n * 0.99))], "max_ms": lat[-1]}


# --- facts --------------------------------------------------------------------------


# A fixed piece of single-threaded CPU work timed by the wall clock, best of a few tries (local
# processes, which the load average sees, only make a try slower). The load average cannot see a
# host whose vCPUs run slower (a busy neighbour on the hypervisor, throttling), yet on such a host
# every figure of a run moves: on 1 Dec 2026 the same VM measured OPA's golden read at ~290 µs in
# the morning and 600-800 µs in the afternoon with a load average near 1. Reported at the start
# and at the end of a run, so two records (or a record and a host) can be compared.
PROBE_STEPS = 2_000_000


def host_probe_ms(tries: int = 5) -> float:
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        total = 0
        for i in range(PROBE_STEPS):
            total += i
        best = min(best, time.perf_counter() - t)
    return round(best * 1000, 1)


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
        # B is the mcp SDK's own server: its cost is the SDK's, and changes with its version
        "mcp_sdk": importlib.metadata.version("mcp"),
        "host_probe_ms": f"{host_probe_ms():g}",
    }


def eval_ns_since(db: Path, since: float, until: float = float("inf")) -> list[int]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT body FROM audit WHERE kind='decision' AND ts >= ? AND ts <= ?", (since, until)
        ).fetchall()
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


# A's benchmarked tool: one GET /nodes, the same Proxmox read B makes (the shipped list_nodes
# also reads each online node's status since the connector rework: 1 + nodes requests per call)
BENCH_TOOL = {
    "name": "bench_list_nodes",
    "title": "List nodes (benchmark)",
    "description": "Benchmark-only tool: one GET /nodes, as the baseline server makes (generated, not shipped).",
    "domain": "node",
    "effect": "read",
    "scope": "cluster",
    "tags": ["inventory"],
    "pve_api": {"method": "GET", "path": "/nodes"},
    "output": {"list": True, "fields": ["node", "status", "cpu", "maxcpu", "mem", "maxmem", "uptime"]},
}


B_TOOL = "list_nodes"  # bench/baseline_server.py's one tool: GET /nodes


def bench_connectors(dest: Path) -> Path:
    """The real connector files plus BENCH_TOOL."""
    shutil.copytree(ROOT / "connectors", dest)
    (dest / "zz-bench.yaml").write_text(yaml.safe_dump({"tools": [BENCH_TOOL]}, sort_keys=False))
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
    opa_cpu: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Any] = field(default_factory=dict)
    ablation: dict[str, Any] = field(default_factory=dict)
    discarded: list[dict[str, Any]] = field(default_factory=list)


def busy(load: float, a: argparse.Namespace) -> bool:
    return bool(a.max_load > 0 and load > a.max_load)


def one_side(
    side: str, server: Proc, url: str, args: list[str], c: int, a: argparse.Namespace, sim_pid: int | None = None
) -> dict[str, Any]:
    """One wrk run against A or B with the CPU the server spent on it (A: gateway and OPA apart), and
    what the simulator and the load generator spent on the same cores meanwhile."""
    script = str(BENCH / "mcp_call.lua")
    total, own = server.cpu_ticks(), server.cpu_ticks(children=False)
    sim0 = _ticks([sim_pid]) if sim_pid else 0
    gen0 = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk is the only child reaped meanwhile
    t0 = time.time()
    w = wrk(url, script, args, c, a.seconds)
    w["t0"], w["t1"] = t0, time.time()
    n = max(1, w["requests"])
    gen1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w["loadgen_cpu_ms_per_call"] = (gen1.ru_utime + gen1.ru_stime - gen0.ru_utime - gen0.ru_stime) * 1000 / n
    w["sim_cpu_ms_per_call"] = (_ticks([sim_pid]) - sim0) * 1000 / HZ / n if sim_pid else float("nan")
    # CPU per call: steadier than req/s on a shared machine (it does not depend on what else competes)
    w["cpu_ms_per_call"] = (server.cpu_ticks() - total) * 1000 / HZ / n
    w["gw_cpu_ms_per_call"] = (server.cpu_ticks(children=False) - own) * 1000 / HZ / n
    w["opa_cpu_ms_per_call"] = w["cpu_ms_per_call"] - w["gw_cpu_ms_per_call"] if side.startswith("A") else 0.0
    return w


def level_rounds(
    c: int, sides: dict[str, tuple[Proc, str, list[str]]], a: argparse.Namespace, res: Results, sim_pid: int | None
) -> dict[str, Any]:
    """`a.rounds` rounds of A and B at concurrency c, alternating which goes first; a round during
    which the 1-minute load average exceeded --max-load is discarded and repeated (at most
    --busy-retries times per round, then kept and marked busy). Medians over the kept rounds."""
    rounds: list[dict[str, Any]] = []
    while len(rounds) < a.rounds:
        for attempt in range(a.busy_retries + 1):
            load_before = os.getloadavg()[0]
            order = ["A", "B"] if (len(rounds) + c) % 2 else ["B", "A"]
            rnd: dict[str, Any] = {"order": "".join(order), "load_before": round(load_before, 2)}
            for side in order:
                server, url, args = sides[side]
                rnd[side] = one_side(side, server, url, args, c, a, sim_pid)
            rnd["load_after"] = round(os.getloadavg()[0], 2)
            rnd["ratio"] = rnd["A"]["rps"] / rnd["B"]["rps"] if rnd["B"]["rps"] else float("inf")
            load = max(rnd["load_before"], rnd["load_after"])
            if busy(load, a) and attempt < a.busy_retries:
                log(f"c={c}: round discarded (1-minute load average {load:.2f} > {a.max_load}); repeating")
                res.discarded.append({"c": c, "load": load, "ratio": rnd["ratio"]})
                time.sleep(a.busy_wait)
                continue
            rnd["busy"] = busy(load, a)
            rounds.append(rnd)
            log(
                f"c={c} round {len(rounds)} ({rnd['order']}, load {load:.2f}): "
                f"A {rnd['A']['rps']:.0f}/s gw {rnd['A']['gw_cpu_ms_per_call']:.2f} + OPA "
                f"{rnd['A']['opa_cpu_ms_per_call']:.2f} ms/call, B {rnd['B']['rps']:.0f}/s "
                f"{rnd['B']['cpu_ms_per_call']:.2f} ms/call, A/B {rnd['ratio']:.2f}"
            )
            break
    med = statistics.median
    row: dict[str, Any] = {"c": c, "rounds": rounds, "ratio": med(r["ratio"] for r in rounds)}
    for side in ("A", "B"):
        keys = (
            *("rps", "p50_us", "p99_us", "cpu_ms_per_call", "gw_cpu_ms_per_call", "opa_cpu_ms_per_call"),
            *("sim_cpu_ms_per_call", "loadgen_cpu_ms_per_call"),
        )
        row[side] = {k: med(r[side][k] for r in rounds) for k in keys}
        row[side]["requests"] = sum(r[side]["requests"] for r in rounds)
        row[side]["ok"] = sum(r[side]["ok"] for r in rounds)
    row["gw_cpu_ratio"] = med(r["A"]["gw_cpu_ms_per_call"] / r["B"]["cpu_ms_per_call"] for r in rounds)
    return row


# --- how much of A's gap is the policy's ------------------------------------------------

A0_DOC = (
    "A0 is A with its policy replaced by a constant: the decision A's policy gave the bench call, as a "
    "literal. Everything else is A's: the same gateway, an OPA sidecar asked over HTTP with the same "
    "input and flags, the same audit commits and Proxmox request. A - A0 is the policy's evaluation; "
    "A0 - B is the rest of what the gateway does and B does not."
)


def constant_policy(audit_db: Path, tool: str, dest: Path) -> Path:
    """A policy directory whose decision is the last one A's policy gave `tool`, as a literal (only the
    contract's fields: what the gateway reads), with a passing data check."""
    con = sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True)
    try:
        row = con.execute(
            "SELECT body FROM audit WHERE kind='decision' AND tool=? ORDER BY seq DESC LIMIT 1", (tool,)
        ).fetchone()
    finally:
        con.close()
    if row is None:
        raise RuntimeError(f"no decision for {tool} in {audit_db}")
    schema = json.loads((ROOT / "gateway" / "schemas" / "decision.schema.json").read_text())
    recorded = json.loads(row[0])
    decision = {k: recorded[k] for k in schema["properties"] if k in recorded}
    decision["contract_version"] = schema["properties"]["contract_version"]["const"]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "constant.rego").write_text(
        "package pvegate\n\n"
        f"decision := {json.dumps(decision, sort_keys=True)}\n\n"
        'data_check := {"valid": true, "problems": []}\n\n'
        "visible_tools := {t.name | some t in input.tools}\n"
    )
    return dest


def policy_ablation(
    sides: dict[str, tuple[Proc, str, list[str]]],
    env: DevEnv,
    sim: SimHandle,
    work: Path,
    a: argparse.Namespace,
    rate: float,
) -> dict[str, Any]:
    """A, A0 and B side by side, rotating who goes first: `a.rounds` wrk rounds at c=8 with CPU per call,
    then `a.fixed_rounds` fixed-rate runs each at `rate` (target 4's rate). Medians."""
    policy = constant_policy(env.config.audit_path, a.tool, work / "a0-policy")
    extra = {"connectors_dir": str(bench_connectors(work / "connectors-a0"))}
    env0 = make_env(
        work / "gw-a0",
        {"default": sim},
        port=free_port(),
        opa={"mode": "managed", "policies": [str(policy)]},
        extra=extra,
    )
    gw0 = start_gateway("gateway-a0", env0, work)
    try:
        all_sides = {**sides, "A0": (gw0, env0.url, [str(write_tokens(env0, work / "tokens-a0.txt")), a.tool])}
        cas = {"A": env.ca_file, "B": env.ca_file, "A0": env0.ca_file}  # B serves A's certificate
        sim_pid = sim.process.pid if sim.process else None
        warm = wrk(env0.url, str(BENCH / "mcp_call.lua"), all_sides["A0"][2], 8, 3)
        if warm["ok"] == 0:
            raise RuntimeError(f"warm-up of A0: no successful call ({warm}); see logs in {work}")
        names = ["A", "A0", "B"]
        c8: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        fixed: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        loads: list[float] = []
        for i in range(a.rounds):
            order = names[i % 3 :] + names[: i % 3]
            for n in order:
                server, url, args = all_sides[n]
                c8[n].append(one_side(n, server, url, args, 8, a, sim_pid))
            loads.append(os.getloadavg()[0])
            log(
                f"A0 c=8 round {i + 1} ({''.join(order)}, load {loads[-1]:.2f}): "
                + ", ".join(f"{n} {c8[n][-1]['rps']:.0f}/s" for n in names)
            )
        for i in range(a.fixed_rounds):
            order = names[i % 3 :] + names[: i % 3]
            for n in order:
                _, url, (tokens, tool) = all_sides[n]
                tokens = tokens if tokens != "-" else all_sides["A"][2][0]  # B ignores the token
                fixed[n].append(
                    fixed_rate("mcp", url, rate, a.fixed_seconds, cas[n], ["--tokens", tokens, "--tool", tool])
                )
            log(
                f"A0 fixed round {i + 1} at {rate:.0f}/s: "
                + ", ".join(f"{n} p50 {ms(fixed[n][-1]['p50_us'])} p99 {ms(fixed[n][-1]['p99_us'])} ms" for n in names)
            )
    finally:
        gw0.stop()
    med = statistics.median
    out: dict[str, Any] = {"rate": rate, "loads": [round(x, 2) for x in loads]}
    for n in names:
        out[n] = {
            k: med(r[k] for r in c8[n])
            for k in ("rps", "p50_us", "p99_us", "gw_cpu_ms_per_call", "opa_cpu_ms_per_call", "cpu_ms_per_call")
        }
        out[n]["fixed_p50_us"] = med(r["p50_us"] for r in fixed[n])
        out[n]["fixed_p99_us"] = med(r["p99_us"] for r in fixed[n])
        out[n]["errors"] = sum(r["requests"] - r["ok"] for r in c8[n]) + sum(r["errors"] for r in fixed[n])
    out["A"]["calls"] = sum(r["requests"] for r in c8["A"]) + sum(r["sent"] for r in fixed["A"])
    for n in ("A", "A0"):
        out[n]["ratio"] = med(x["rps"] / y["rps"] for x, y in zip(c8[n], c8["B"], strict=True) if y["rps"])
    return out


def run(a: argparse.Namespace) -> Results:
    work = Path(tempfile.mkdtemp(prefix="pvegate-bench-"))
    res = Results(machine(), {k: v for k, v in vars(a).items() if k != "record"})
    procs: list[Proc] = []
    sim: SimHandle | None = None
    try:
        log(f"workdir {work}; starting simulator ({a.scenario})")
        sim = start_simulator(a.scenario, work / "sim")
        scrape_token = work / "scrape-token"
        scrape_token.write_text(os.urandom(24).hex() + "\n")
        extra = {
            "connectors_dir": str(bench_connectors(work / "connectors-bench")),
            "metrics": {"token": {"file": str(scrape_token)}},  # the phase means of the fixed-rate runs
        }
        env = make_env(work / "gw", {"default": sim}, port=free_port(), extra=extra)
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
        a_args, b_args = [str(tokens), a.tool], ["-", B_TOOL]
        sides = {"A": (gw, env.url, a_args), "B": (base, b_url, b_args)}

        log("warm-up")
        for url, args in ((env.url, a_args), (b_url, b_args)):
            w = wrk(url, script, args, 8, 3)
            if w["ok"] == 0:
                raise RuntimeError(f"warm-up of {url}: no successful call ({w}); see logs in {work}")

        for c in a.levels:
            if c == 8 and not res.phases:
                res.phases = phase_profile(gw, env.url, a_args, a)
            res.levels.append(level_rounds(c, sides, a, res, sim.process.pid if sim.process else None))

        c1 = [r for row in res.levels if row["c"] == 1 for r in row["rounds"]]
        evals = [ns for r in c1 for ns in eval_ns_since(env.config.audit_path, r["A"]["t0"], r["A"]["t1"])]
        res.opa = {
            "decisions": len(evals),
            "p50_us": pct(evals, 50) / 1000,
            "p99_us": pct(evals, 99) / 1000,
            "mean_us": statistics.fmean(evals) / 1000 if evals else float("nan"),
        }
        log(
            f"OPA eval at c=1 over {len(evals)} decisions: "
            f"p50 {res.opa['p50_us']:.0f} µs, p99 {res.opa['p99_us']:.0f} µs"
        )

        b_peak = max(row["B"]["rps"] for row in res.levels)
        rate = b_peak / 3
        log(
            f"fixed rate {rate:.0f}/s (a third of B's peak {b_peak:.0f}/s), "
            f"{a.fixed_seconds}s each: A and B alternating"
        )
        runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        metrics_url = env.url.replace("/mcp", "/metrics")
        phases: dict[str, list[float]] = {}
        slow: dict[str, list[int]] = {}  # phase -> [waits over 5 ms, waits]
        for i in range(a.fixed_rounds):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                url, tool = (env.url, a.tool) if side == "A" else (b_url, B_TOOL)
                auth = ["--tokens", str(tokens), "--tool", tool]  # B ignores the token
                before = phase_sums(metrics_url, env.ca_file, scrape_token) if side == "A" else {}
                runs[side].append(fixed_rate("mcp", url, rate, a.fixed_seconds, env.ca_file, auth))
                if side == "A":
                    after = phase_sums(metrics_url, env.ca_file, scrape_token)
                    for ph, (s1, n1, w1) in after.items():
                        s0, n0, w0 = before.get(ph, (0.0, 0, 0))
                        if n1 > n0:
                            phases.setdefault(ph, []).append((s1 - s0) / (n1 - n0) * 1000)
                            tally = slow.setdefault(ph, [0, 0])
                            tally[0] += (n1 - n0) - (w1 - w0)
                            tally[1] += n1 - n0
        med = statistics.median
        fa = {k: med(r[k] for r in runs["A"]) for k in ("p50_us", "p99_us")}
        fb = {k: med(r[k] for r in runs["B"]) for k in ("p50_us", "p99_us")}
        res.fixed = {
            "rate": rate,
            "A": {**fa, "errors": sum(r["errors"] for r in runs["A"]), "runs": runs["A"]},
            "B": {**fb, "errors": sum(r["errors"] for r in runs["B"]), "runs": runs["B"]},
            "added_p50_us": fa["p50_us"] - fb["p50_us"],
            "added_p99_us": fa["p99_us"] - fb["p99_us"],
            "phase_mean_ms": {ph: statistics.median(v) for ph, v in phases.items()},
            "phase_over_5ms": {ph: over / n for ph, (over, n) in slow.items() if n},
        }
        log(f"fixed: A p99 {fa['p99_us'] / 1000:.2f} ms, B p99 {fb['p99_us'] / 1000:.2f} ms")
        res.fixed["fsync"] = disk_sync_latency(env.config.audit_path.parent)
        log(
            f"fdatasync on the audit's disk: p50 {res.fixed['fsync']['p50_ms']:.2f} ms, "
            f"p99 {res.fixed['fsync']['p99_ms']:.2f} ms"
        )

        log("A0: A with its decision a constant, against A and B (how much of the gap is the policy's)")
        res.ablation = policy_ablation(sides, env, sim, work, a, rate)

        calls_a = sum(row["A"]["requests"] for row in res.levels) + sum(r["sent"] for r in runs["A"])
        calls_a += res.ablation["A"]["calls"]
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
        log("OPA CPU per decision: the repository's policy against a trivial one (bench/opa_cpu.py)")
        res.opa_cpu = opa_cpu.measure(a.opa_requests, a.rounds)
        res.machine["host_probe_ms_end"] = f"{host_probe_ms():g}"
        return res
    finally:
        for p in reversed(procs):
            p.stop()
        if sim is not None:
            sim.stop()
        log(f"logs kept in {work}")


# --- where the gateway's CPU goes -------------------------------------------------------

# (phase, markers): a sampled stack of the event loop's thread belongs to the first phase any of
# whose markers appears in one of its frames (py-spy names files relative to their sys.path
# entry: "(aiohttp/client.py:..)"). Both the Proxmox client (gateway/tools/runtimes/transport.py)
# and the OPA client are aiohttp: dispatch is matched first by its gateway frames; aiohttp's
# socket callbacks, which run without their caller's frames, count as "decide".
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("authenticate", ("(gateway/auth/", "(jwt/", "(cryptography/")),
    ("audit", ("(gateway/store/audit", "(gateway/store/outbox", "(aiosqlite/", "(sqlite3/")),
    ("dispatch", ("(gateway/tools/", "(httpx/", "(httpcore/", "(anyio/")),
    ("decide", ("(gateway/policy/", "(opa_client/", "(aiohttp/", "(fastjsonschema/")),
    ("pipeline", ("(gateway/pipeline", "(gateway/mcp/", "(gateway/store/", "(gateway/observability/")),
    ("HTTP", ("(uvicorn/", "(h11/", "(starlette/", "(asyncio/sslproto", "(ssl.py")),
]


# (owner, markers) of the *innermost* frame of a sample: whose code the event loop's thread was running.
# Target 2's exception ("the remaining cost is outside the gateway's code") is read from this split.
OWNERS: list[tuple[str, tuple[str, ...]]] = [
    ("the gateway's own code", ("(gateway/",)),
    (
        "inbound HTTP server and TLS (uvicorn, h11, starlette, ssl)",
        ("(uvicorn/", "(h11/", "(starlette/", "(ssl.py", "(asyncio/sslproto"),
    ),
    (
        "HTTP clients to OPA and Proxmox (aiohttp, opa-client, yarl, multidict)",
        ("(aiohttp/", "(opa_client/", "(yarl/", "(multidict/"),
    ),
    (
        "event loop, sockets, threads (asyncio, selectors, concurrent.futures)",
        ("(asyncio/", "(selectors.py", "(concurrent/", "(threading.py", "(queue.py"),
    ),
    ("JSON (json module)", ("(json/",)),
]


def owner(stack: str) -> str:
    leaf = stack.rsplit(";", 1)[-1]
    for name, markers in OWNERS:
        if any(m in leaf for m in markers):
            return name
    return "other libraries and the standard library"


def classify(stack: str) -> str:
    for phase, markers in PHASES:
        if any(m in stack for m in markers):
            return phase
    return "event loop and other"


def thread_ticks(pid: int) -> dict[str, int]:
    """utime+stime of the event loop's thread (the main thread: its id is the process's) and of the
    others (the audit writer's SQLite work and fsyncs, the quota store's thread). Python 3.11 does
    not give its threads OS names, so they are told apart by id."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = "event loop thread" if task.name == str(pid) else "other threads (audit writer, stores)"
        out[name] = out.get(name, 0) + int(fields[11]) + int(fields[12])
    return out


def phase_profile(gw: Proc, url: str, args: list[str], a: argparse.Namespace) -> dict[str, Any]:
    """While wrk drives A at c=8: the gateway's CPU by thread (from /proc: exact), and the event
    loop thread's samples by phase (py-spy). py-spy counts a thread waiting in fsync as busy, so
    the audit writer thread is measured by its CPU ticks, not its samples."""
    spy = ROOT / ".venv" / "bin" / "py-spy"
    if not spy.exists():
        return {"error": "py-spy is not installed (pip install -e '.[dev]')"}
    out = Path(tempfile.mkstemp(prefix="pvegate-spy-", suffix=".txt")[1])
    cmd = [str(spy), "record", "--nonblocking", "--threads", "-r", "100", "-d", str(max(2, round(a.seconds)))]
    spy_proc = subprocess.Popen(
        [*cmd, "-f", "raw", "-o", str(out), "-p", str(gw.popen.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    before = thread_ticks(gw.popen.pid)
    wrk(url, str(BENCH / "mcp_call.lua"), args, 8, a.seconds)
    after = thread_ticks(gw.popen.pid)
    try:
        _, err = spy_proc.communicate(timeout=a.seconds + 60)
    except subprocess.TimeoutExpired:
        spy_proc.kill()
        return {"error": "py-spy did not finish"}
    counts: dict[str, int] = {}
    owners: dict[str, int] = {}
    for line in out.read_text().splitlines() if out.exists() else []:
        stack, _, n = line.rpartition(" ")
        if n.isdigit() and "MainThread" in stack.split(";", 1)[0]:
            phase, whose = classify(stack), owner(stack)
            counts[phase] = counts.get(phase, 0) + int(n)
            owners[whose] = owners.get(whose, 0) + int(n)
    out.unlink(missing_ok=True)
    total = sum(counts.values())
    if not total:
        return {"error": f"no samples ({err.decode(errors='replace').strip()[-300:]})"}
    used = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    all_ticks = sum(used.values()) or 1
    threads = {k: v / all_ticks for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v}
    return {
        "samples": total,
        "share": {k: v / total for k, v in sorted(counts.items(), key=lambda kv: -kv[1])},
        "owners": {k: v / total for k, v in sorted(owners.items(), key=lambda kv: -kv[1])},
        "threads": threads,
    }


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


def signed_ms(us: float) -> str:
    return f"{us / 1000:+.2f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def core_budget(c8: dict[str, Any]) -> str:
    """Target 1 in CPU: every process of a run shares the same cores, so A's rate is bounded by the
    cores over the CPU all of them spend per call, while B's is bounded by its one event loop."""
    A, B = c8["A"], c8["B"]
    sim, gen = A.get("sim_cpu_ms_per_call"), A.get("loadgen_cpu_ms_per_call")
    if sim is None or gen is None or sim != sim:  # nan: no simulator pid
        return ""
    cores = os.cpu_count() or 1
    a_total = A["gw_cpu_ms_per_call"] + A["opa_cpu_ms_per_call"] + sim + gen
    b_total = B["cpu_ms_per_call"] + B["sim_cpu_ms_per_call"] + B["loadgen_cpu_ms_per_call"]
    need = cores * 1000 / B["rps"] - sim - gen if B["rps"] else float("nan")
    return (
        f"; CPU per call on the {cores} shared cores: A = gateway {A['gw_cpu_ms_per_call']:.2f} + OPA "
        f"{A['opa_cpu_ms_per_call']:.2f} + simulator {sim:.2f} + load generator {gen:.2f} = {a_total:.2f} ms "
        f"(at most {cores * 1000 / a_total:.0f} calls/s), B = server {B['cpu_ms_per_call']:.2f} + simulator "
        f"{B['sim_cpu_ms_per_call']:.2f} + load generator {B['loadgen_cpu_ms_per_call']:.2f} = {b_total:.2f} ms, "
        f"B's one event loop capping it at {1000 / B['cpu_ms_per_call']:.0f} calls/s; A at B's {B['rps']:.0f} calls/s "
        f"needs gateway + OPA ≤ {need:.2f} ms per call (now {A['gw_cpu_ms_per_call'] + A['opa_cpu_ms_per_call']:.2f})"
    )


def own_code_bound(c8: dict[str, Any], ph: dict[str, Any]) -> str:
    """What target 2 would read if the gateway's own code cost nothing: A's gateway CPU less the event
    loop thread's share of samples in gateway/ frames (the rest is the libraries, the interpreter, the
    kernel and SQLite doing the work the design asks for: HTTPS in, an HTTP query to OPA, an HTTPS
    request to Proxmox, durable audit commits)."""
    own, threads = ph.get("owners", {}).get("the gateway's own code"), ph.get("threads", {})
    loop_share = threads.get("event loop thread")
    if own is None or loop_share is None:
        return ""
    gw, b = c8["A"]["gw_cpu_ms_per_call"], c8["B"]["cpu_ms_per_call"]
    own_ms = gw * loop_share * own
    return (
        f"; the gateway's own code is {own_ms:.2f} ms/call of it ({own * 100:.0f} % of the event loop's samples), "
        f"so with that code at zero cost A would still be {(gw - own_ms) / b:.2f}x B"
    )


def latency_parts(f: dict[str, Any]) -> str:
    """Where target 4's added latency sits: the disk's fdatasync (each A call waits for two commits)
    and A's own waits per phase during the fixed-rate runs (its /metrics)."""
    out = ""
    if f.get("fsync"):
        out += (
            f"; fdatasync on the audit's disk right after: p50 {f['fsync']['p50_ms']:.2f} ms, "
            f"p99 {f['fsync']['p99_ms']:.2f} ms (each A call waits for two commits, B for none)"
        )
    if f.get("phase_mean_ms"):
        out += "; A's mean per call by phase (its /metrics): " + ", ".join(
            f"{ph} {v:.2f} ms" for ph, v in sorted(f["phase_mean_ms"].items())
        )
        if f.get("phase_over_5ms"):
            out += "; waits over 5 ms: " + ", ".join(
                f"{ph} {v * 100:.1f} %" for ph, v in sorted(f["phase_over_5ms"].items())
            )
    return out


def ablation_note(ab: dict[str, Any], key: str) -> str:
    """Target 1's or 4's figure for A0, run beside A and B in the ablation (see A0_DOC)."""
    if not ab:
        return ""
    A0, B = ab["A0"], ab["B"]
    if key == "throughput":
        return (
            f"; with its decision a constant (A0, same run, OPA still asked): A0/B = {A0['ratio']:.2f}x, "
            f"A/B {ab['A']['ratio']:.2f}x"
        )
    return (
        "; with its decision a constant (A0, same run, OPA still asked): "
        f"p99 {signed_ms(A0['fixed_p99_us'] - B['fixed_p99_us'])} ms, "
        f"p50 {signed_ms(A0['fixed_p50_us'] - B['fixed_p50_us'])} ms over B"
    )


def ablation_lines(ab: dict[str, Any]) -> list[str]:
    if not ab:
        return []
    B = ab["B"]
    lines = [
        "",
        f"How much of the gap is the policy's (A0; {len(ab['loads'])} rounds at c=8 rotating A, A0, B, then "
        f"fixed-rate runs at {ab['rate']:.0f}/s; loads {' '.join(f'{x:.1f}' for x in ab['loads'])}). {A0_DOC}",
        "",
        "| side | c=8 req/s | /B | gateway CPU ms/call | OPA CPU ms/call | p50 ms at the fixed rate | p99 ms | "
        "added p50 / p99 over B | failed calls |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for n in ("A", "A0", "B"):
        x = ab[n]
        gw = x["gw_cpu_ms_per_call"] if n != "B" else x["cpu_ms_per_call"]
        opa = f"{x['opa_cpu_ms_per_call']:.2f}" if n != "B" else "-"
        added = (
            f"{signed_ms(x['fixed_p50_us'] - B['fixed_p50_us'])} / {signed_ms(x['fixed_p99_us'] - B['fixed_p99_us'])}"
            if n != "B"
            else "-"
        )
        rel = f"{x['ratio']:.2f}x" if n != "B" else "1.00x"
        lines.append(
            f"| {n} | {x['rps']:.0f} | {rel} | {gw:.2f} | {opa} | {ms(x['fixed_p50_us'])} | {ms(x['fixed_p99_us'])} | "
            f"{added} | {x['errors']} |"
        )
    return lines


def report(r: Results, command: str) -> str:
    m = r.machine
    rows = {row["c"]: row for row in r.levels}
    discarded_loads = (": loads " + ", ".join(f"{d['load']:.1f}" for d in r.discarded)) if r.discarded else ""
    lines = [
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — `{command}`",
        "",
        f"Machine: {m['cpu']}, {m['memory']} RAM, Linux {m['kernel']}, Python {m['python']}, OPA {m['opa']}, "
        f"{m['wrk']}; mcp SDK {m['mcp_sdk']} (B's cost is the SDK's); 1-minute load average before the run: "
        f"{m['load_1m_before']}. Host speed probe ({PROBE_STEPS:,} steps of a Python loop, best of 5; "
        f"lower is faster, the load average cannot see a slow host): {m.get('host_probe_ms', '?')} ms at the "
        f"start, {m.get('host_probe_ms_end', '?')} ms at the end. No CPU pinning: the load generator, pvegate, "
        "its OPA sidecar, the baseline and the simulator share all cores.",
        "",
        f"Each level: {r.params['rounds']} rounds of A and B alternating ({r.params['seconds']:g} s each), "
        "medians; a round with the 1-minute load average above "
        f"{r.params['max_load']:g} is discarded and repeated "
        f"({len(r.discarded)} discarded{discarded_loads}).",
        "",
        "| concurrency | A req/s | A p50 ms | A p99 ms | B req/s | B p50 ms | B p99 ms | A/B throughput | "
        "A gateway CPU ms/call | A OPA CPU ms/call | B CPU ms/call | load per round |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in r.levels:
        A, B = row["A"], row["B"]
        loads = " ".join(f"{max(x['load_before'], x['load_after']):.1f}" for x in row["rounds"])
        lines.append(
            f"| {row['c']} | {A['rps']:.0f} | {ms(A['p50_us'])} | {ms(A['p99_us'])} | {B['rps']:.0f} | "
            f"{ms(B['p50_us'])} | {ms(B['p99_us'])} | {row['ratio']:.2f}x | {A['gw_cpu_ms_per_call']:.2f} | "
            f"{A['opa_cpu_ms_per_call']:.2f} | {B['cpu_ms_per_call']:.2f} | {loads} |"
        )
    errs = [(row["c"], side, row[side]["requests"] - row[side]["ok"]) for row in r.levels for side in ("A", "B")]
    bad = [e for e in errs if e[2]]
    lines += [
        "",
        "Failed calls during the throughput runs: " + (", ".join(f"{s}@c={c}: {n}" for c, s, n in bad) or "none") + ".",
    ]
    f, mem, tl, oc = r.fixed, r.memory, r.tools_list, r.opa_cpu
    c8 = rows.get(8)
    na = "not measured (no c=8 level)"
    t1 = (
        (
            f"A/B = {c8['ratio']:.2f}x (median of {len(c8['rounds'])} rounds){core_budget(c8)}"
            f"{ablation_note(r.ablation, 'throughput')}",
            c8["ratio"] >= 1.0,
        )
        if c8
        else (na, False)
    )
    t2 = (
        (
            f"A's gateway {c8['A']['gw_cpu_ms_per_call']:.2f} ms/call, B {c8['B']['cpu_ms_per_call']:.2f} ms/call: "
            f"{c8['gw_cpu_ratio']:.2f}x (median of per-round ratios){own_code_bound(c8, r.phases)}",
            c8["gw_cpu_ratio"] <= 0.7,
        )
        if c8
        else (na, False)
    )
    allocs = oc.get("allocs_optimized") or oc.get("allocs_plain")
    t3_ok = oc.get("ratio", float("inf")) <= 3 and allocs is not None and allocs <= 1500
    t3 = (
        f"policy {oc.get('policy_cpu_ms', float('nan')):.3f} ms vs trivial "
        f"{oc.get('trivial_cpu_ms', float('nan')):.3f} ms "
        f"of OPA CPU per decision = {oc.get('ratio', float('nan')):.2f}x; `opa bench` allocations, golden read: "
        f"{oc.get('allocs_optimized')} as the sidecar loads it (partially evaluated), {oc.get('allocs_plain')} plain; "
        "`opa build -O=1` answers = plain answers: tests/policy/test_optimized.py",
        t3_ok,
    )
    t4 = (
        f"at {f['rate']:.0f}/s: p99 A {ms(f['A']['p99_us'])} - B {ms(f['B']['p99_us'])} = {ms(f['added_p99_us'])} ms; "
        f"p50 A {ms(f['A']['p50_us'])} - B {ms(f['B']['p50_us'])} = {ms(f['added_p50_us'])} ms "
        f"(errors A {f['A']['errors']}, B {f['B']['errors']}){latency_parts(f)}{ablation_note(r.ablation, 'latency')}",
        f["added_p99_us"] <= 3000 and f["added_p50_us"] <= 1000,
    )
    t5 = (
        f"{tl['fresh'].get('visible')} tools ({tl['fresh'].get('bytes', 0) // 1024} KiB): uncached c=1 p50 "
        f"{ms(tl['fresh']['c1']['p50_us'])} ms, cached p50 {ms(tl['reused']['c1']['p50_us'])} ms",
        tl["fresh"]["c1"]["p50_us"] <= 15000 and tl["reused"]["c1"]["p50_us"] <= 5000,
    )
    t6 = (
        f"{mem['base_rss_kb'] / 1024:.1f} → {mem['final_rss_kb'] / 1024:.1f} MiB ({mem['growth_pct']:+.1f} %) "
        f"from call {mem['base_calls']} to {mem['final_calls']}, {mem['failed_calls']} failed calls",
        mem["growth_pct"] < 10,
    )
    o = r.opa
    t7 = (
        f"OPA's timer_rego_query_eval_ns over {o['decisions']} decisions of the c=1 runs: p50 {o['p50_us']:.0f} µs, "
        f"p99 {o['p99_us']:.0f} µs ({o['p99_us'] / o['p50_us']:.1f}x); standalone at c=1 (bench/opa_cpu.py): "
        f"p50 {oc.get('eval_p50_us', float('nan')):.0f} µs, p99 {oc.get('eval_p99_us', float('nan')):.0f} µs",
        o["p99_us"] <= 3 * o["p50_us"],
    )
    targets = [
        ("1. throughput A/B at c=8 ≥ 1.0", t1),
        ("2. gateway CPU per call ≤ 0.7 x B's at c=8", t2),
        ("3. OPA CPU per decision ≤ 3 x a trivial policy's; allocations ≤ 1,500", t3),
        ("4. added latency at a third of B's peak: p99 ≤ 3 ms, p50 ≤ 1 ms", t4),
        ("5. tools/list, 500 extra tools: uncached p50 ≤ 15 ms, cached ≤ 5 ms", t5),
        (f"6. RSS growth < 10 % from call {r.params['memory_base']} to the end", t6),
        ("7. OPA eval at c=1: p99 ≤ 3 x p50", t7),
    ]
    lines += ["", "| target (#16) | measured | verdict |", "|---|---|---|"]
    lines += [f"| {name} | {text} | {verdict(ok)} |" for name, (text, ok) in targets]
    lines += ablation_lines(r.ablation)
    ph = r.phases
    if ph.get("share"):
        parts = ", ".join(f"{k} {v * 100:.0f} %" for k, v in ph["share"].items())
        lines += ["", f"Event-loop thread by phase (py-spy, {ph['samples']} samples of A's gateway at c=8): {parts}."]
        if ph.get("owners"):
            oparts = ", ".join(f"{k} {v * 100:.0f} %" for k, v in ph["owners"].items())
            lines += [
                "",
                f"Event-loop thread by whose code ran (the sample's innermost frame, same samples): {oparts}.",
            ]
        if ph.get("threads"):
            tparts = ", ".join(f"{k} {v * 100:.0f} %" for k, v in ph["threads"].items())
            lines += ["", f"Gateway CPU by thread (/proc ticks, same run): {tparts}."]
    elif ph:
        lines += ["", f"Gateway CPU by phase: not measured ({ph.get('error')})."]
    lines += [
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
    p.add_argument("--quick", action="store_true", help="a short run of every target (~5 min; not recorded)")
    p.add_argument("--seconds", type=float, default=10, help="per wrk run")
    p.add_argument("--levels", default="1,8,32", help="wrk connection counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds per level (medians reported)")
    p.add_argument("--max-load", type=float, default=2.0 * (os.cpu_count() or 1), help="discard a busier round")
    p.add_argument("--busy-retries", type=int, default=2, help="repeats of a discarded round before keeping it")
    p.add_argument("--busy-wait", type=float, default=20, help="seconds to wait before repeating a round")
    p.add_argument("--fixed-rounds", type=int, default=2, help="fixed-rate runs per side, alternating")
    p.add_argument("--opa-requests", type=int, default=2000, help="decisions per side per round in the OPA CPU run")
    p.add_argument("--scenario", default="default", help="simulator scenario")
    p.add_argument("--tool", default=BENCH_TOOL["name"], help="the tool every benchmarked call runs")
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
    if a.quick:  # every target, briefly: a check that nothing regressed, not a record
        a.seconds, a.levels, a.fixed_seconds, a.fixed_rounds = 3, "1,8", 8, 1
        a.memory_calls, a.memory_base, a.memory_chunk, a.opa_requests, a.busy_retries = 6_000, 2_000, 5, 500, 0
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
