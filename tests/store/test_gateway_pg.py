"""A real gateway on PostgreSQL while the server goes away and comes back: every call is refused
with the audit-store error (-32010, HTTP 503, nothing sent to Proxmox) and /readyz is red while it is
down; calls are served again once it is back, without restarting the gateway; one chain verifies."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.dev.devenv import make_env
from gateway.store import audit as auditlib
from gateway.store.audit_seal import HeadKey
from gateway.store.pgsync import PgLocation
from tests.pgserver import start_postgres
from tests.store.auditstore import new_pg_database, off, sign_new_chain
from tests.store.test_audit_backends import start_server, stop_server
from tests.support import GatewayThread, free_port


async def test_postgresql_down_means_refused_calls_and_red_readiness_then_served_again(
    sim: Any, tmp_path: Path
) -> None:
    server = start_postgres()  # its own: the session's server is shared by other tests
    gw: GatewayThread | None = None
    try:
        url = await new_pg_database(server)
        port = free_port()
        env = make_env(
            tmp_path / "gw",
            {"default": sim},
            port=port,
            extra={
                "storage": {"url": url},
                "health": {"cluster_probe_interval": 0, "audit_probe_interval": 0.5, "audit_probe_timeout": 2},
            },
        )
        HeadKey.create(env.config.audit_key_path)  # what `pvegate db upgrade` makes once ...
        await sign_new_chain(url, env.config.audit_key_path)  # ... and signs the new chain's mark with
        gw = GatewayThread(env.config).start()
        ctx = ssl.create_default_context(cafile=str(env.ca_file))
        token = env.token("pg-agent", ["operator"])
        headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
        base = env.url.rsplit("/mcp", 1)[0]
        async with httpx.AsyncClient(verify=ctx, timeout=30) as http:
            n = 0

            async def call() -> tuple[int, dict[str, Any]]:
                nonlocal n
                n += 1
                params = {"name": "list_nodes", "arguments": {}}
                r = await http.post(
                    env.url, json={"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}, headers=headers
                )
                return r.status_code, r.json()

            status, doc = await call()
            assert status == 200 and doc["result"]["_meta"]["pvegate/outcome"] == "allowed", doc
            served = [doc["result"]["_meta"]["pvegate/request_id"]]

            argv = await asyncio.to_thread(stop_server, server)
            sent_before = len(sim.requests_log())
            for _ in range(3):
                status, doc = await call()
                assert status == 503 and doc["error"]["code"] == -32010, doc
                assert "audit store cannot take writes" in doc["error"]["message"]
                assert "Traceback" not in str(doc)
            assert len(sim.requests_log()) == sent_before  # nothing reached Proxmox
            deadline = time.monotonic() + 15
            while (r := await http.get(base + "/readyz")).status_code == 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert r.status_code == 503 and not r.json()["checks"]["audit"]["ok"], r.text

            await asyncio.to_thread(start_server, server, argv)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                status, doc = await call()
                if status == 200:
                    break
                await asyncio.sleep(0.3)
            assert status == 200 and doc["result"]["_meta"]["pvegate/outcome"] == "allowed", doc
            served.append(doc["result"]["_meta"]["pvegate/request_id"])
            while (r := await http.get(base + "/readyz")).status_code != 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert r.status_code == 200, r.text
        gw.stop()
        gw = None
        res = off(auditlib.verify, PgLocation(url), key=env.config.audit_key_path)
        assert res.ok, res.problem
        decided = {r["request_id"] for r in off(auditlib.search, PgLocation(url), auditlib.Query(kind="decision"))}
        assert set(served) <= decided
    finally:
        if gw is not None:
            gw.stop()
        server.stop()
