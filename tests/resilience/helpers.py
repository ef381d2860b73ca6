"""Helpers shared by the resilience and adversarial tests: a dedicated gateway per
test module (own audit DB, own simulator), raw JSON-RPC over HTTPS, audit reads."""

from __future__ import annotations

import dataclasses
import ssl
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.core.config import Config, load
from gateway.dev.devenv import DevEnv, make_env
from tests.support import audit_rows, free_port

PROTOCOL = "2025-06-18"


def resilient_env(workdir: Path, sim: Any, cluster_timeout: float = 1.5) -> DevEnv:
    """make_env around `sim`, with a short Proxmox timeout so fault tests stay fast."""
    env = make_env(workdir, {"default": sim}, port=free_port())
    raw = yaml.safe_load(env.config_path.read_text())
    for c in raw["clusters"]:
        c["timeout"] = cluster_timeout
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dataclasses.replace(env, config=load(env.config_path))


def fresh_config(env: DevEnv, name: str) -> Config:
    """The env's config on a new port with its own audit database."""
    return dataclasses.replace(
        env.config, port=free_port(), audit_path=env.config.audit_path.with_name(f"audit-{name}.db")
    )


def url_of(cfg: Config) -> str:
    return f"https://127.0.0.1:{cfg.port}/mcp"


def client(env: DevEnv, **kw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30.0, **kw)


def call_body(tool: str, arguments: Any, *, meta: dict[str, Any] | None = None, id_: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {
        "jsonrpc": "2.0",
        "id": id_ if id_ is not None else uuid.uuid4().hex[:8],
        "method": "tools/call",
        "params": params,
    }


def headers(token: str | None) -> dict[str, str]:
    h = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": PROTOCOL}
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    return h


async def call(http: httpx.AsyncClient, url: str, token: str, tool: str, arguments: Any = None) -> httpx.Response:
    return await http.post(url, json=call_body(tool, arguments or {}), headers=headers(token))


def result_of(r: httpx.Response) -> dict[str, Any]:
    doc = r.json()
    assert "result" in doc, doc
    res: dict[str, Any] = doc["result"]
    return res


def text_of(res: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in res.get("content", []))


def request_id(res: dict[str, Any]) -> str:
    return str(res["_meta"]["pvegate/request_id"])


def decisions_by_request(db: Path) -> dict[str, dict[str, Any]]:
    return {r["request_id"]: r for r in audit_rows(db) if r["kind"] == "decision"}
