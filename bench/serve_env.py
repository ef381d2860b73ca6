"""Bring up the benchmark environment and keep it running (for profiling by hand).

    .venv/bin/python bench/serve_env.py [--scenario default]
prints the gateway URL, the CA, a tokens file and the PIDs, then waits for Ctrl-C.
Then e.g.:  wrk -t1 -c1 -d20s -s bench/mcp_call.lua URL -- TOKENS list_nodes
            .venv/bin/py-spy record -p GATEWAY_PID -d 15 -o profile.svg
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from run import start_gateway, write_tokens

from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import free_port
from gateway.sim.harness import start_simulator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", default="default")
    p.add_argument("--decision-logs", action="store_true", help="turn on OPA's console decision log")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pvegate-benchenv-"))
    sim = start_simulator(a.scenario, work / "sim")
    opa = {"mode": "managed", "decision_logs": a.decision_logs}
    env = make_env(work / "gw", {"default": sim}, port=free_port(), opa=opa)
    gw = start_gateway("gateway", env, work)
    tokens = write_tokens(env, work / "tokens.txt")
    print(f"url={env.url}\nca={env.ca_file}\ntokens={tokens}\ngateway_pid={gw.popen.pid}\nsim_api={sim.api_url}")
    print(
        f"sim_ca={sim.ca_file}\npve_token={work / 'gw' / 'secrets' / 'default-pve-token'}\nworkdir={work}", flush=True
    )
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # sigwait needs them blocked
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        gw.stop()
        sim.stop()
        time.sleep(0.1)


if __name__ == "__main__":
    main()
