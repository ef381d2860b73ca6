"""tools/list alone (target 5): the bench's 500 synthetic tools, wrk at c=1, reused and fresh listings.

    .venv/bin/python bench/tools_list_timing.py [--rounds 3] [--seconds 5]

Starts a simulator and two gateways (tools_list_cache_seconds 10 and 0) over the repo's
connectors plus 500 generated read tools, as `bench/run.py` does, and prints p50/p99 per
round with the 1-minute load average. To compare with an older tree side by side, export it
(`git archive REV | tar -x -C /tmp/old`, symlink .venv and .tools into it) and run its copy of
this script (or this one) with PYTHONPATH=/tmp/old from /tmp, in alternation with this tree's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import ssl
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run import BENCH, Proc, start_gateway, wrk

from gateway.dev.devenv import make_env, synthetic_connectors
from gateway.policy.opa_sidecar import free_port
from gateway.sim.harness import start_simulator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--synthetic-tools", type=int, default=500)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pvegate-tools-list-"))
    sim = start_simulator("default", work / "sim")
    gateways: list[Proc] = []
    try:
        conn = synthetic_connectors(work / "connectors", a.synthetic_tools)
        sides = []
        for mode, ttl in (("reused", 10.0), ("fresh", 0.0)):
            extra = {"connectors_dir": str(conn), "tools_list_cache_seconds": ttl}
            env = make_env(work / f"gw-{mode}", {"default": sim}, port=free_port(), extra=extra)
            gateways.append(start_gateway(f"gw-{mode}", env, work))
            token = env.token("bench-lister", ["operator"], kind="service", ttl_seconds=3600)
            tf = work / f"token-{mode}.txt"
            tf.write_text(token + "\n")
            r = httpx.post(
                env.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"},
                verify=ssl.create_default_context(cafile=str(env.ca_file)),
                timeout=10,
            )
            print(f"{mode}: {len(r.json()['result']['tools'])} tools listed, {len(r.content)} bytes", flush=True)
            sides.append((mode, env.url, tf))
        for n in range(1, a.rounds + 1):
            for mode, url, tf in sides:
                load = Path("/proc/loadavg").read_text().split()[0]
                w = wrk(url, str(BENCH / "mcp_call.lua"), [str(tf), "@list"], 1, a.seconds)
                row = {"round": n, "mode": mode, "requests": w["requests"], "load_1m": float(load)}
                row |= {"p50_ms": w["p50_us"] / 1000, "p99_ms": w["p99_us"] / 1000}
                print(json.dumps(row), flush=True)
    finally:
        for gw in gateways:
            gw.stop()
        sim.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
