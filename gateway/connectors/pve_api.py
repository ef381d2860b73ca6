"""The pve_api runtime: declared method + path template → one HTTPS request to Proxmox.

The API token is read from the cluster's secret reference and sent only in the
Authorization header; it never comes from a tool call and is never logged.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

import httpx

from gateway.catalog import Tool
from gateway.config import ClusterConfig
from gateway.connectors import CallContext, ToolError, ToolOutput


def _ssl_context(cluster: ClusterConfig) -> ssl.SSLContext | bool:
    if not cluster.verify_tls:
        return False
    ctx = ssl.create_default_context(cafile=str(cluster.ca_file) if cluster.ca_file else None)
    return ctx


class PveApiClient:
    """One keep-alive HTTPS client per cluster."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self._auth = f"PVEAPIToken={cluster.token.read()}"
        self.http = httpx.AsyncClient(
            base_url=cluster.api_url,
            verify=_ssl_context(cluster),
            timeout=httpx.Timeout(cluster.timeout),
            headers={"Authorization": self._auth},
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        data: dict[str, Any] | None = None,
    ) -> Any:
        try:
            r = await self.http.request(method, path, params=params, data=data)
        except httpx.TimeoutException as exc:
            raise ToolError(f"Proxmox cluster {self.cluster.name} did not answer in time") from exc
        except httpx.HTTPError as exc:
            raise ToolError(f"Proxmox cluster {self.cluster.name} unreachable ({type(exc).__name__})") from exc
        if r.status_code == 401:
            raise ToolError(f"Proxmox rejected the gateway's API token for cluster {self.cluster.name}")
        if r.status_code >= 400:
            reason = r.reason_phrase or ""
            try:
                body = r.json()
                if isinstance(body, dict) and body.get("errors"):
                    reason = f"{reason}: {body['errors']}"
            except ValueError:
                pass
            raise ToolError(f"Proxmox answered {r.status_code} {reason}".strip())
        try:
            return r.json().get("data")
        except (ValueError, AttributeError) as exc:
            raise ToolError("Proxmox answer was not the expected JSON envelope") from exc

    async def close(self) -> None:
        await self.http.aclose()


def render_path(template: str, arguments: dict[str, Any]) -> str:
    """Fill {placeholders} from validated arguments, each quoted as one path segment."""
    out = template
    for key, value in arguments.items():
        token = "{" + key + "}"
        if token in out:
            out = out.replace(token, quote(str(value), safe=""))
    if "{" in out:
        raise ToolError(f"path template {template} has an unfilled placeholder")
    return out


class PveApiRuntime:
    def __init__(self, clients: dict[str, PveApiClient]) -> None:
        self.clients = clients

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput:
        client = self.clients.get(ctx.cluster)
        if client is None:
            raise ToolError(f"unknown cluster {ctx.cluster}")
        spec = tool.spec
        path = render_path(spec["path"], arguments)
        query = {p: arguments[p] for p in spec.get("query", []) if p in arguments}
        data = await client.request(spec["method"], path, params=query or None)
        return ToolOutput(data=data)

    async def close(self) -> None:
        for c in self.clients.values():
            await c.close()
