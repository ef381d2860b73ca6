"""The operator side of the audit on PostgreSQL (store/pgsync.py) while the server cannot be reached.

The admin API, the console and reconciliation read the audit through `PgConnection`, whose errors are
`sqlite3.OperationalError`s (PgError): what the stores' callers already answer as "the store is
unavailable" (a 503 with Retry-After, never a 500). A server that refuses the connection (down,
restarting, failing over) raised the socket's own `ConnectionRefusedError` instead: an internal error
with a stack trace in the log and a 500 to the operator, on a real gateway whose PostgreSQL was stopped.
"""

from __future__ import annotations

import asyncio
import sqlite3
import ssl
from pathlib import Path
from typing import Any

import httpx

from gateway.store import audit as auditlib
from gateway.store.audit_seal import HeadKey
from gateway.store.pgsync import PgConnection, PgLocation
from tests.pgserver import start_postgres
from tests.store.auditstore import new_pg_database, sign_new_chain
from tests.store.test_audit_backends import stop_server
from tests.support import GatewayThread, free_port


async def test_an_unreachable_postgresql_is_a_store_error_for_the_operator_side(tmp_path: Path) -> None:
    server = start_postgres()
    try:
        url = await new_pg_database(server)
        await asyncio.to_thread(stop_server, server)
        try:
            await asyncio.to_thread(PgConnection, PgLocation(url), readonly=True)
        except sqlite3.OperationalError as exc:  # what every caller of the operator side catches
            assert "cannot be reached" in str(exc), exc
        else:
            raise AssertionError("connected to a stopped server")
        try:
            await asyncio.to_thread(auditlib.search, PgLocation(url), auditlib.Query(limit=1))
        except sqlite3.OperationalError:
            pass
    finally:
        server.stop()


async def test_the_admin_api_answers_503_not_500_for_audit_records_while_postgresql_is_down(
    sim: Any, tmp_path: Path
) -> None:
    from gateway.dev.devenv import make_env

    server = start_postgres()  # its own: it is stopped
    gw: GatewayThread | None = None
    try:
        url = await new_pg_database(server)
        env = make_env(
            tmp_path / "gw",
            {"default": sim},
            port=free_port(),
            extra={"storage": {"url": url}, "health": {"cluster_probe_interval": 0}},
        )
        HeadKey.create(env.config.audit_key_path)
        await sign_new_chain(url, env.config.audit_key_path)
        gw = GatewayThread(env.config).start()
        ctx = ssl.create_default_context(cafile=str(env.ca_file))
        base = env.url.rsplit("/mcp", 1)[0]
        assert env.config.admin.token is not None
        headers = {"Authorization": f"Bearer {env.config.admin.token.read()}"}
        async with httpx.AsyncClient(verify=ctx, timeout=60) as http:
            r = await http.get(base + "/admin/audit/records?limit=5", headers=headers)
            assert r.status_code == 200, r.text
            await asyncio.to_thread(stop_server, server)
            r = await http.get(base + "/admin/audit/records?limit=5", headers=headers)
            assert r.status_code == 503, (r.status_code, r.text)
            assert r.json()["error"] == "store_unavailable", r.text
            assert r.headers.get("Retry-After"), r.headers
            assert "Traceback" not in r.text and "127.0.0.1" not in r.text
    finally:
        if gw is not None:
            gw.stop()
        server.stop()
