"""Open-loop fixed-rate load generator (wrk2 is not in Debian; this stands in for it).

Requests are *scheduled* at a fixed rate regardless of how fast answers come back,
and each latency is measured from its scheduled start (so a stalled server is not
hidden by the generator waiting for it: no coordinated omission). Runs in its own
process and speaks HTTP/1.1 itself over kept-alive TLS connections (asyncio
streams): an httpx client would spend ~1.4 ms of CPU per request on these 2 cores,
stealing more from the servers under test than the load it generates.
Prints one JSON line: {"rate", "sent", "ok", "errors", "p50_us", "p99_us", ...}.

    python bench/fixed_rate.py mcp URL --rate 150 --seconds 20 --tokens FILE --ca CA
    python bench/fixed_rate.py sim URL/nodes --rate 150 --seconds 20 --pve-token FILE --ca CA
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import ssl
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


async def exchange(conn: Conn, request: bytes) -> tuple[int, bytes]:
    reader, writer = conn
    writer.write(request)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readexactly(2)
        await reader.readuntil(b"\r\n")
        return status, bytes(body)
    return status, await reader.readexactly(int(headers.get("content-length", "0")))


async def run(a: argparse.Namespace) -> dict[str, object]:
    ctx = ssl.create_default_context(cafile=str(a.ca))
    url = urlsplit(a.url)
    host, port = url.hostname or "127.0.0.1", url.port or 443
    tokens = itertools.cycle(a.token_list) if a.token_list else None

    def request(seq: int) -> bytes:
        if a.mode == "mcp":
            assert tokens is not None
            body = json.dumps(
                {"jsonrpc": "2.0", "id": seq, "method": "tools/call", "params": {"name": a.tool, "arguments": {}}}
            ).encode()
            extra = (
                f"Authorization: Bearer {next(tokens)}\r\nContent-Type: application/json\r\n"
                "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n"
                f"Content-Length: {len(body)}\r\n"
            )
            return f"POST {url.path} HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}\r\n".encode() + body
        auth = f"Authorization: PVEAPIToken={a.pve_value}\r\n"
        return f"GET {url.path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n".encode()

    pool: asyncio.Queue[Conn] = asyncio.Queue()
    for _ in range(a.connections):
        pool.put_nowait(await asyncio.open_connection(host, port, ssl=ctx))
    latencies: list[float] = []
    errors = 0

    async def one(seq: int, scheduled: float) -> None:
        nonlocal errors
        conn = await pool.get()  # waiting for a free connection counts: latency runs from `scheduled`
        try:
            status, body = await exchange(conn, request(seq))
            good = status == 200 and b'"isError":true' not in body and b'"error":{' not in body
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            good = False
            conn[1].close()
            conn = await asyncio.open_connection(host, port, ssl=ctx)
        pool.put_nowait(conn)
        if good:
            latencies.append(time.perf_counter() - scheduled)
        else:
            errors += 1

    await asyncio.gather(*(one(-i, time.perf_counter()) for i in range(a.connections)))  # warm-up
    latencies.clear()
    errors = 0
    interval = 1.0 / a.rate
    start = time.perf_counter()
    total = int(a.rate * a.seconds)
    tasks = []
    for seq in range(total):
        scheduled = start + seq * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(seq, scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    while not pool.empty():
        pool.get_nowait()[1].close()
    lat = sorted(latencies)
    return {
        "rate": a.rate,
        "achieved_rps": round(len(tasks) / elapsed, 1),
        "sent": total,
        "ok": len(lat),
        "errors": errors,
        "client_cpu_ms_per_request": round(time.process_time() / max(1, total) * 1000, 3),
        "p50_us": round(percentile(lat, 50) * 1e6),
        "p90_us": round(percentile(lat, 90) * 1e6),
        "p99_us": round(percentile(lat, 99) * 1e6),
        "max_us": round((lat[-1] if lat else 0) * 1e6),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["mcp", "sim"])
    p.add_argument("url")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--tokens")
    p.add_argument("--pve-token")
    p.add_argument("--tool", default="list_nodes")
    p.add_argument("--ca", required=True)
    a = p.parse_args()
    a.token_list = [t for t in Path(a.tokens).read_text().split() if t] if a.tokens else []
    a.pve_value = Path(a.pve_token).read_text().strip() if a.pve_token else None
    print("FIXEDJSON " + json.dumps(asyncio.run(run(a))))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
