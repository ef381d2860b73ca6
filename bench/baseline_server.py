"""Benchmark baseline B: a bare MCP server built with the mcp SDK's own server.

One tool, `list_nodes`, makes the same simulator read as pvegate's `list_nodes`
(GET /nodes with the same API token, one keep-alive httpx client) and returns
the rows. No authentication, no policy, no audit. Served the way pvegate is:
uvicorn, one worker, HTTPS with the same certificate, stateless Streamable HTTP
with JSON responses (mcp 2.3: MCPServer.streamable_http_app(stateless_http=True,
json_response=True)).

    python bench/baseline_server.py --port P --sim-url URL --token-file F \
        --sim-ca CA --cert CERT --key KEY
"""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings


def build(sim_url: str, token: str, sim_ca: Path, port: int) -> Any:
    http = httpx.AsyncClient(
        base_url=sim_url,
        headers={"Authorization": f"PVEAPIToken={token}"},
        verify=ssl.create_default_context(cafile=str(sim_ca)),
        timeout=httpx.Timeout(10.0),
        limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
    )
    server: MCPServer[Any] = MCPServer("baseline", log_level="WARNING")  # no per-request log lines

    @server.tool()
    async def list_nodes() -> dict[str, Any]:
        """List the cluster nodes (the same read pvegate's list_nodes makes)."""
        r = await http.get("/nodes")
        r.raise_for_status()
        return {"items": r.json()["data"]}

    return server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        # the same Host check pvegate's transport guard makes
        transport_security=TransportSecuritySettings(allowed_hosts=[f"127.0.0.1:{port}"]),
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sim-url", required=True)
    p.add_argument("--token-file", type=Path, required=True)
    p.add_argument("--sim-ca", type=Path, required=True)
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    a = p.parse_args()
    app = build(a.sim_url, a.token_file.read_text().strip(), a.sim_ca, a.port)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=a.port,
        workers=1,
        log_level="warning",
        access_log=False,
        server_header=False,
        ssl_certfile=str(a.cert),
        ssl_keyfile=str(a.key),
    )


if __name__ == "__main__":
    main()
