"""What does the MCP server machinery cost per call? The SDK's server vs our lean handler.

Both serve the same trivial tool (`echo`, returns its argument) over Streamable HTTP,
stateless, JSON responses, driven in-process through raw ASGI calls (no sockets, no
TLS, no auth, no OPA, no audit), so the difference is the transport + dispatch layer
alone. Each era is measured: a 2025-11-25 request (after initialize) and a
self-describing 2026-07-28 request.

    .venv/bin/python bench/mcp_transport.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.mcp import modern
from gateway.mcp.jsonrpc import RpcFault, error_response, parse_message, result_response

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGI = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}


def sdk_app() -> Starlette:
    server = MCPServer("bench")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    return server.streamable_http_app(
        json_response=True,
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )


async def lean_handler(request: Request) -> Response:
    """Our transport path (gateway/mcp/transport.py + modern.py) minus auth, OPA and audit."""
    version = request.headers.get("mcp-protocol-version")
    try:
        msg = parse_message(await request.body())
        if modern.is_modern(version):
            raw = [(k.decode(), v.decode()) for k, v in request.scope["headers"]]
            modern.classify(msg, dict(request.headers), raw)
        text = str((msg.params.get("arguments") or {}).get("text", ""))
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
        if modern.is_modern(version):
            result["resultType"] = "complete"
        return result_response(msg.id, result)
    except RpcFault as f:
        return error_response(f.id, f.code, f.message, f.data)


def lean_app() -> Starlette:
    return Starlette(routes=[Route("/mcp", lean_handler, methods=["POST"])])


def request_for(era: str, i: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    params: dict[str, Any] = {"name": "echo", "arguments": {"text": f"hello {i}"}}
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
    ]
    if era == "2026-07-28":
        params["_meta"] = MODERN_META
        headers += [(b"mcp-protocol-version", b"2026-07-28"), (b"mcp-method", b"tools/call"), (b"mcp-name", b"echo")]
    else:
        headers += [(b"mcp-protocol-version", b"2025-11-25")]
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}).encode()
    headers.append((b"content-length", str(len(body)).encode()))
    return headers, body


async def one_call(app: ASGI, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = 0
    chunks: list[bytes] = []
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def measure(app: Starlette, era: str, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        headers, body = request_for(era, i)
        t0 = time.perf_counter_ns()
        status, out = await one_call(app, headers, body)
        samples.append((time.perf_counter_ns() - t0) / 1000)
        if status != 200 or b'"hello ' not in out:
            raise SystemExit(f"{era}: unexpected answer {status} {out[:200]!r}")
    return samples


async def main(calls: int) -> None:
    rows = []
    for name, factory in (("sdk MCPServer (stateless, json)", sdk_app), ("pvegate lean handler", lean_app)):
        app = factory()
        async with app.router.lifespan_context(app):
            for era in ("2025-11-25", "2026-07-28"):
                await measure(app, era, min(300, calls))  # warm-up
                s = sorted(await measure(app, era, calls))
                rows.append((name, era, statistics.median(s), s[int(len(s) * 0.99) - 1], 1e6 / statistics.mean(s)))
    print("| server | era | p50 µs/call | p99 µs/call | calls/s (one core, in-process) |")
    print("|---|---|---:|---:|---:|")
    for name, era, p50, p99, rate in rows:
        print(f"| {name} | {era} | {p50:.0f} | {p99:.0f} | {rate:.0f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3000)
    asyncio.run(main(ap.parse_args().calls))
