"""Connecting the official `mcp` SDK client to pvegate (demo, tests, benchmarks)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
from mcp.client.client import Client
from mcp.client.session import ElicitationFnT
from mcp.client.streamable_http import streamable_http_client


@asynccontextmanager
async def mcp_client(
    url: str,
    token: str | None,
    ca_file: Path | None,
    *,
    mode: str = "legacy",
    elicitation_callback: ElicitationFnT | None = None,
) -> AsyncIterator[Client]:
    """An SDK Client speaking Streamable HTTP to `url`, verifying TLS against `ca_file`.

    mode: "legacy" (initialize handshake, 2025-11-25), "2026-07-28" (stateless, pinned) or
    "auto" (server/discover probe, falls back to the handshake). An elicitation callback
    declares URL elicitation, which turns a pending approval into the in-protocol hand-off.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
    # A client we hand to the SDK is ours to close: its keep-alive connections would
    # otherwise outlive the session and hold the server's graceful shutdown.
    async with httpx2.AsyncClient(headers=headers, verify=verify, timeout=httpx2.Timeout(30.0)) as http:
        client = Client(
            streamable_http_client(url, http_client=http),
            mode=mode,  # type: ignore[arg-type]
            elicitation_callback=elicitation_callback,
        )
        async with client:
            yield client
