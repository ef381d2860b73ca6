"""`pvegate db migrate-from-sqlite`, end to end: a real gateway writes its SQLite audit, the
command moves it (and the approvals) into a real PostgreSQL, the chain verifies there under the
same key, and a gateway on PostgreSQL keeps serving on the same chain."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.core.config import load
from gateway.dev.devenv import DevEnv, make_env
from gateway.store import audit as auditlib
from gateway.store.approvals import ApprovalStore
from gateway.store.db import PostgresDatabase
from gateway.store.pgsync import PgLocation
from tests.config.conftest import run_pvegate
from tests.pgserver import PostgresServer
from tests.store.auditstore import off
from tests.store.test_stores import approved, request
from tests.support import GatewayThread, free_port


async def empty_pg(server: PostgresServer) -> str:
    return await server.create_database("g_")


async def calls(env: DevEnv, n: int) -> list[str]:
    """n allowed reads through the gateway: their request ids."""
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    token = env.token("migrate-agent", ["operator"])
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
    out = []
    async with httpx.AsyncClient(verify=ctx, timeout=30) as http:
        for i in range(n):
            body = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": "list_nodes", "arguments": {}},
            }
            r = await http.post(env.url, json=body, headers=headers)
            doc = r.json()
            assert r.status_code == 200 and doc["result"]["_meta"]["pvegate/outcome"] == "allowed", doc
            out.append(str(doc["result"]["_meta"]["pvegate/request_id"]))
    return out


def pg_config(env: DevEnv, url: str, port: int) -> Path:
    """The same installation, storage.url now PostgreSQL (audit.path kept: the key stays where it was)."""
    raw: dict[str, Any] = yaml.safe_load(env.config_path.read_text())
    raw["storage"] = {"url": url}
    raw["listen"]["port"] = port
    raw["public_url"] = f"https://127.0.0.1:{port}"
    path = env.workdir / "pvegate-pg.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


async def test_a_single_host_installation_moves_to_postgresql_and_keeps_serving(
    sim: Any, postgres: PostgresServer, tmp_path: Path
) -> None:
    env = make_env(tmp_path / "gw", {"default": sim}, port=free_port())
    db = env.config.audit_path
    gw = GatewayThread(env.config).start()
    try:
        before = await calls(env, 3)
    finally:
        gw.stop()
    store = ApprovalStore(db)  # an approval granted on the single host, its token not yet used
    await store.open()
    try:
        await store.find_or_create(request(digest="sha256:" + "2" * 64))  # one still pending
        apr_id, _token = await approved(store)
    finally:
        await store.close()
    sqlite_end = off(auditlib.verify, db, key=env.config.audit_key_path)
    assert sqlite_end.ok, sqlite_end.problem

    url = await empty_pg(postgres)
    cfg = pg_config(env, url, free_port())
    r = await asyncio.to_thread(
        run_pvegate, "db", "migrate-from-sqlite", "--from", f"sqlite://{db}", "--config", str(cfg)
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SQLite audit verified: {sqlite_end.checked} records" in r.stdout
    assert f"PostgreSQL audit verified: {sqlite_end.checked} records, head record {sqlite_end.last_seq}" in r.stdout
    assert "2 approval requests and 1 votes" in r.stdout, r.stdout

    # the same chain under the same key: verify on PostgreSQL names the same head
    r = await asyncio.to_thread(run_pvegate, "audit", "verify", "--config", str(cfg))
    assert r.returncode == 0 and f"authenticated head {sqlite_end.head_hash}" in r.stdout, r.stdout + r.stderr
    # a second move into a target that now holds an audit is refused, nothing touched
    r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(cfg))
    assert r.returncode == 1 and "already holds" in r.stderr and "Traceback" not in r.stderr, r.stderr

    # keep serving: a gateway on PostgreSQL continues the moved chain and finds the moved approval
    pg_env = dataclasses.replace(env, config_path=cfg, config=load(cfg), url=_url(cfg))
    gw = GatewayThread(pg_env.config).start()
    try:
        after = await calls(pg_env, 2)
    finally:
        gw.stop()
    where = PgLocation(url)
    res = off(auditlib.verify, where, key=env.config.audit_key_path)
    assert res.ok and res.first_seq == 1 and res.last_seq is not None and res.last_seq > sqlite_end.last_seq, res
    ids = {r["request_id"] for r in off(auditlib.search, where, auditlib.Query(kind="decision"))}
    assert set(before) | set(after) <= ids
    moved = ApprovalStore(PostgresDatabase(url))
    await moved.open()
    try:
        got = await moved.get(apr_id)
        assert got is not None and got.state == "approved"
    finally:
        await moved.close()


def _url(cfg: Path) -> str:
    raw = yaml.safe_load(cfg.read_text())
    return f"https://127.0.0.1:{raw['listen']['port']}/mcp"


async def test_a_chain_that_does_not_verify_is_not_moved(postgres: PostgresServer, tmp_path: Path) -> None:
    from gateway.store.audit import AuditLog, AuditRecord

    db = tmp_path / "state" / "audit.db"
    log = AuditLog(db)
    await log.open()
    await log.append(AuditRecord("r1", "decision", outcome="allow"), AuditRecord("r2", "decision", outcome="allow"))
    await log.close()
    off(_tamper, db)
    from tests.config.conftest import minimal, write

    raw = minimal(tmp_path)
    raw["storage"] = {"url": await empty_pg(postgres)}
    env_cfg = write(tmp_path, raw)
    r = await asyncio.to_thread(run_pvegate, "db", "migrate-from-sqlite", "--from", str(db), "--config", str(env_cfg))
    assert r.returncode == 1 and "does not verify, nothing was moved" in r.stderr, r.stdout + r.stderr
    assert "record 1 was changed" in r.stderr


def _tamper(db: Path) -> None:
    import sqlite3

    con = sqlite3.connect(db)
    con.execute("UPDATE audit SET outcome = 'deny' WHERE seq = 1")
    con.commit()
    con.close()
