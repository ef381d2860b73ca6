"""Raw Streamable-HTTP helpers for wire-level tests (what a hand-written client would send)."""

from __future__ import annotations

from typing import Any

import httpx

MODERN = "2026-07-28"


def modern_body(
    method: str, params: dict[str, Any], id_: int = 1, capabilities: dict[str, Any] | None = None
) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
        "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1"},
    }
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": method,
        "params": {**params, "_meta": {**meta, **params.get("_meta", {})}},
    }


def modern_headers(token: str, method: str, name: str | None = None) -> dict[str, str]:
    headers = {
        "authorization": f"Bearer {token}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    if name is not None:
        headers["mcp-name"] = name
    return headers


def modern_post(
    http: httpx.Client,
    url: str,
    token: str,
    method: str,
    params: dict[str, Any],
    *,
    capabilities: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    name = params.get("name") if method == "tools/call" else None
    h = modern_headers(token, method, name)
    h.update(headers or {})
    return http.post(url, headers=h, json=modern_body(method, params, capabilities=capabilities))
