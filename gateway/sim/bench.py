"""Measure the simulator's request rate: `python -m gateway.sim.bench [--scenario default]`.

Clients run in separate processes (httpx, keep-alive, loopback) so the numbers
are the simulator's, not the client's. If `wrk` is installed it is run as well.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from gateway.sim.harness import start_simulator


def _client(url: str, ca: str, token: str, seconds: float, out: mp.Queue[tuple[int, int]]) -> None:
    ctx = ssl.create_default_context(cafile=ca)
    ok = errors = 0
    with httpx.Client(verify=ctx, headers={"Authorization": f"PVEAPIToken={token}"}) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r = c.get(url)
            if r.status_code == 200:
                ok += 1
            else:
                errors += 1
    out.put((ok, errors))


def run_httpx(url: str, ca: str, token: str, clients: int, seconds: float) -> float:
    q: mp.Queue[tuple[int, int]] = mp.Queue()
    procs = [mp.Process(target=_client, args=(url, ca, token, seconds, q)) for _ in range(clients)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    ok = sum(r[0] for r in results)
    if any(r[1] for r in results):
        raise RuntimeError(f"benchmark saw errors: {results}")
    return ok / seconds


def run_wrk(url: str, token: str, connections: int, seconds: int) -> str | None:
    wrk = shutil.which("wrk")
    if not wrk:
        return None
    res = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "-H", f"Authorization: PVEAPIToken={token}", url],
        capture_output=True, text=True, timeout=seconds + 30, check=False,
    )  # fmt: skip
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--path", default="/cluster/resources")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=1)
    args = ap.parse_args()
    h = start_simulator(args.scenario, Path(tempfile.mkdtemp(prefix="pvegate-bench-")), ssh=False)
    try:
        url = h.api_url + args.path
        token = h.tokens["admin"]
        size = len(httpx.get(url, verify=ssl.create_default_context(cafile=str(h.ca_file)),
                             headers={"Authorization": f"PVEAPIToken={token}"}).content)  # fmt: skip
        rate = run_httpx(url, str(h.ca_file), token, args.clients, args.seconds)
        print(f"httpx: {args.clients} client process(es), keep-alive, {args.path} ({size} B): {rate:.0f} req/s")
        out = run_wrk(url, token, 8, int(args.seconds))
        if out:
            print("wrk -t1 -c8:\n" + out)
    finally:
        h.stop()


if __name__ == "__main__":
    main()
