"""Target 4's tail, call by call: A and B at a fixed rate, with per-call traces.

Needs the temporary instrumentation in trace.patch (never shipped: it writes files from the
event loop and shortens the GIL switch interval):

    git apply bench/tail/trace.patch
    .venv/bin/python bench/tail/run_tail.py OUT_DIR [ROUNDS] [SECONDS]
    .venv/bin/python bench/tail/analyse.py OUT_DIR 0
    git apply -R bench/tail/trace.patch

The gateway writes OUT_DIR/gw_trace.jsonl (each call's phases), lag.txt (event-loop stalls
over 2 ms and the loop thread's CPU during them), lag.txt.gc (collections over 1 ms),
lag.txt.stacks (the loop thread's stack when it has not turned for 8 ms) and wtrace.jsonl
(each audit append: queue wait, thread time, handoffs); the generator writes
client_<side><round>.jsonl (each call's scheduled time and latency). docs/performance.md,
"Target 4's tail, call by call", reads them.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

import run as R  # noqa: E402  (bench/run.py: the benchmark's own start-up helpers)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 30
    work = Path(tempfile.mkdtemp(prefix="pvegate-tail-"))
    sim = R.start_simulator("default", work / "sim")
    procs: list[R.Proc] = []
    try:
        extra = {"connectors_dir": str(R.bench_connectors(work / "connectors-bench"))}
        env = R.make_env(work / "gw", {"default": sim}, port=R.free_port(), extra=extra)
        traces = {"PVEGATE_TRACE": "gw_trace.jsonl", "PVEGATE_LAG": "lag.txt", "PVEGATE_WTRACE": "wtrace.jsonl"}
        os.environ.update({k: str(out / v) for k, v in traces.items()})
        gw = R.start_gateway("gateway", env, work)
        procs.append(gw)
        for k in traces:
            del os.environ[k]
        b_port = R.free_port()
        tls = env.config.tls
        pve_token = work / "gw" / "secrets" / "default-pve-token"
        cmd = [R.PY, str(R.BENCH / "baseline_server.py"), "--port", str(b_port), "--sim-url", sim.api_url]
        cmd += ["--token-file", str(pve_token), "--sim-ca", str(sim.ca_file), "--cert", str(tls.cert)]
        base = R.spawn("baseline", [*cmd, "--key", str(tls.key)], work)
        procs.append(base)
        b_url = f"https://127.0.0.1:{b_port}/mcp"
        R.wait_https(f"https://127.0.0.1:{b_port}/", env.ca_file, base)
        tokens = R.write_tokens(env, work / "tokens.txt")
        script = str(R.BENCH / "mcp_call.lua")
        for url, args in ((env.url, [str(tokens), R.BENCH_TOOL["name"]]), (b_url, ["-", R.B_TOOL])):
            R.wrk(url, script, args, 8, 3)
        peak = R.wrk(b_url, script, ["-", R.B_TOOL], 8, 8)["rps"]
        rate = float(os.environ.get("RATE", peak / 3))
        print(f"B peak {peak:.0f}/s, rate {rate:.0f}/s, host probe {R.host_probe_ms()} ms", flush=True)
        for i in range(rounds):
            for side in ("A", "B") if i % 2 == 0 else ("B", "A"):
                url, tool = (env.url, R.BENCH_TOOL["name"]) if side == "A" else (b_url, R.B_TOOL)
                os.environ["FIXED_TRACE"] = str(out / f"client_{side}{i}.jsonl")
                if side == "A":
                    (out / f"mark_A{i}").write_text(str(time.time()))
                r = R.fixed_rate("mcp", url, rate, seconds, env.ca_file, ["--tokens", str(tokens), "--tool", tool])
                keys = ("p50_us", "p99_us", "max_us", "errors")
                print(side, i, {k: r[k] for k in keys}, flush=True)
    finally:
        for p in reversed(procs):
            p.stop()
        sim.stop()
        print("logs in", work)


if __name__ == "__main__":
    main()
