"""The PostgreSQL stores' bounds, on a real PostgreSQL (and a real gateway, its OPA included):

- a lock held elsewhere (an operator's `LOCK TABLE`, a schema upgrade while replicas serve) refuses a
  store call within lock_timeout, and calls beyond the pool's connections within the acquire timeout,
  each saying so: not waves of pool_max_size x 30 s ending in "cannot be reached";
- a statement that gets no answer in time says so, not "cannot be reached";
- the quota, hold and approval stores of one process share one pool: storage.pool_max_size connections
  for them all (plus the audit's), not one pool each, and the shared pool is closed once, by the last;
- an MCP client refused for the audit store (an unauthenticated one included) is not told the store's
  error text (the database's name, host, port, role): that stays in the log and /admin/health.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from gateway.core.config import load
from gateway.dev.devenv import make_env
from gateway.store.audit_seal import HeadKey
from gateway.store.db import (
    LOCK_TIMEOUT_SECONDS,
    DatabaseUnavailable,
    PostgresDatabase,
    SharedDatabase,
    database,
)
from gateway.store.usage import SqlQuotas
from tests.config.conftest import minimal, write
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database, sign_new_chain
from tests.support import GatewayThread, free_port


def _config(tmp_path: Path, url: str, **storage: Any) -> Any:
    raw = minimal(tmp_path)
    raw["storage"] = {"url": url, **storage}
    return load(write(tmp_path, raw))


async def test_the_stores_sessions_wait_for_a_lock_at_most_lock_timeout(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = await new_pg_database(postgres, "l_")
    db = database(_config(tmp_path, url))  # what a replica's approval, quota and hold stores use
    await db.open()
    try:
        rows = await db.fetch("SELECT current_setting('lock_timeout') AS lock_timeout")
        assert rows[0]["lock_timeout"] == f"{LOCK_TIMEOUT_SECONDS}s"  # was "0": wait for as long as it is held
    finally:
        await db.close()


async def test_a_table_lock_held_elsewhere_refuses_calls_in_seconds_and_says_why(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """pool_max_size 1, an operator's session holds usage_events locked: the call that has the connection is
    refused after lock_timeout (5 s), the ones waiting for the connection after the acquire timeout (made 1 s
    here); none queues behind the others for command_timeout (30 s) each, none says "cannot be reached"."""
    url = await new_pg_database(postgres, "l_")
    db = database(_config(tmp_path, url, pool_max_size=1))
    assert isinstance(db, PostgresDatabase)
    db.acquire_timeout = 1.0  # the default (10 s) shortened for the test
    quotas = SqlQuotas(db)
    await quotas.open()
    dba = await asyncpg.connect(url)
    try:
        await dba.execute("BEGIN")
        await dba.execute("LOCK TABLE usage_events IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()

        async def call(i: int) -> tuple[float, BaseException | None]:
            try:
                await quotas.reserve(f"p{i}", "vm_start")
            except Exception as exc:
                return time.monotonic() - started, exc
            return time.monotonic() - started, None

        async with asyncio.timeout(LOCK_TIMEOUT_SECONDS + 4):
            results = await asyncio.gather(*(call(i) for i in range(3)))
        errors = [exc for _, exc in results]
        assert all(isinstance(exc, DatabaseUnavailable) for exc in errors), results
        texts = [str(exc) for exc in errors]
        assert not any("cannot be reached" in t for t in texts), texts
        locked = [t for t in texts if "a lock stayed held past lock_timeout" in t]
        busy = [t for t in texts if "connections of this process's pool" in t and "stayed busy for 1 s" in t]
        assert len(locked) == 1 and len(busy) == 2, texts
        assert max(at for at, _ in results) < LOCK_TIMEOUT_SECONDS + 2, results
        await dba.execute("COMMIT")
        counts, _slot = await quotas.reserve("p0", "vm_start")  # the lock released: served again
        assert counts["tool"]["1m"] == 0
    finally:
        await dba.close()
        await quotas.close()


async def test_a_statement_without_an_answer_in_time_says_so(postgres: PostgresServer, tmp_path: Path) -> None:
    url = await new_pg_database(postgres, "l_")
    db = database(_config(tmp_path, url))
    assert isinstance(db, PostgresDatabase)
    db.command_timeout = 0.5  # the default (30 s) shortened for the test
    await db.open()
    try:
        for attempt in ("fetch", "transaction"):
            with pytest.raises(DatabaseUnavailable) as got:
                async with asyncio.timeout(2.5):
                    if attempt == "fetch":
                        await db.fetch("SELECT pg_sleep(2)")
                    else:
                        async with db.transaction() as tx:
                            await tx.fetch("SELECT pg_sleep(2)")
            assert "did not answer a statement within 0.5 s" in str(got.value), (attempt, got.value)
            assert "cannot be reached" not in str(got.value)
        assert (await db.fetch("SELECT 1 AS one"))[0]["one"] == 1  # the pool goes on
    finally:
        await db.close()


async def test_a_shared_database_is_opened_by_the_first_handle_and_closed_by_the_last(
    postgres: PostgresServer,
) -> None:
    url = await new_pg_database(postgres, "l_")
    shared = SharedDatabase(PostgresDatabase(url, max_size=2))
    a, b, never = shared.handle(), shared.handle(), shared.handle()
    await a.open()
    await b.open()
    assert a.pool is b.pool
    await a.close()
    await a.close()  # twice: counted once
    await never.close()  # never opened: not counted
    assert (await b.fetch("SELECT 1 AS one"))[0]["one"] == 1  # still open for the other store
    async with b.transaction() as tx:
        assert await tx.execute("DELETE FROM usage_events") == 0
    await b.close()
    with pytest.raises(RuntimeError, match="not open"):
        await b.fetch("SELECT 1")


async def _backends(url: str) -> int:
    mon = await asyncpg.connect(url)
    try:
        return int(
            await mon.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    finally:
        await mon.close()


async def _drain(pool: Any, timeout: float) -> list[Any]:
    held = []
    while True:
        try:
            held.append(await pool.acquire(timeout=timeout))
        except TimeoutError:
            return held


async def _pg_gateway(sim: Any, tmp_path: Path, url: str, **storage: Any) -> tuple[Any, GatewayThread]:
    env = make_env(
        tmp_path / "gw",
        {"default": sim},
        port=free_port(),
        extra={
            "storage": {"url": url, **storage},
            "health": {"cluster_probe_interval": 0},
        },
    )
    HeadKey.create(env.config.audit_key_path)  # what `pvegate db upgrade` makes once, and signs the chain with
    await sign_new_chain(url, env.config.audit_key_path)
    return env, GatewayThread(env.config).start()


async def test_a_gateway_on_postgresql_shares_one_pool_and_keeps_the_stores_errors_to_itself(
    sim: Any, postgres: PostgresServer, tmp_path: Path
) -> None:
    """One process: storage.pool_max_size connections for its quota, hold and approval stores (one pool
    they share), plus the audit's. Then the database is dropped under it: PostgreSQL's answer names it;
    an unauthenticated client (its auth_failure row cannot be written) and an authenticated one get
    -32010 without it, the operator finds it in /admin/health."""
    url = await new_pg_database(postgres, "l_")
    name = url.rsplit("/", 1)[1]
    env, gw = await _pg_gateway(sim, tmp_path, url, pool_max_size=2)
    try:
        await _one_pool_for_the_stores(env, gw, url)
        await _store_errors_stay_with_the_operator(env, name, postgres)
    finally:
        gw.stop()


async def _one_pool_for_the_stores(env: Any, gw: GatewayThread, url: str) -> None:
    c = gw.components
    assert c.approvals.store is not None
    stores = [c.usage.database, c.holds.database, c.approvals.store.database]  # type: ignore[attr-defined]
    pools = {id(db.pool): db.pool for db in stores}
    assert gw.loop is not None

    async def saturate() -> list[tuple[Any, Any]]:
        # every connection the stores' pools will give, and the audit's: all this process may hold
        held = [(pool, conn) for pool in pools.values() for conn in await _drain(pool, 0.3)]
        audit_pool = c.audit._pgdb.pool  # type: ignore[attr-defined]
        return held + [(audit_pool, conn) for conn in await _drain(audit_pool, 0.3)]

    held = asyncio.run_coroutine_threadsafe(saturate(), gw.loop).result(30)
    try:
        stores_held = sum(1 for pool, _ in held if id(pool) in pools)
        assert len(pools) == 1 and stores_held == 2, (len(pools), stores_held)  # was 3 pools, 6 connections
        assert await _backends(url) <= 2 + 4  # storage.pool_max_size + the audit's pool
    finally:

        async def release() -> None:
            for pool, conn in held:
                await pool.release(conn)

        asyncio.run_coroutine_threadsafe(release(), gw.loop).result(30)
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    headers = {
        "Authorization": f"Bearer {env.token('pool-agent', ['operator'])}",
        "MCP-Protocol-Version": "2025-06-18",
    }
    async with httpx.AsyncClient(verify=ctx, timeout=30) as http:  # the stores serve calls on the shared pool
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_nodes", "arguments": {}},
        }
        r = await http.post(env.url, json=body, headers=headers)
        assert r.status_code == 200 and r.json()["result"]["_meta"]["pvegate/outcome"] == "allowed", r.text


async def _store_errors_stay_with_the_operator(env: Any, name: str, postgres: PostgresServer) -> None:
    admin = await asyncpg.connect(postgres.dsn)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    token = env.token("leak-agent", ["operator"])
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "list_nodes", "arguments": {}}}
    secrets_of_the_store = (name, str(postgres.port), "127.0.0.1", "pvegate", "does not exist")
    async with httpx.AsyncClient(verify=ctx, timeout=30) as http:
        for auth in ("Bearer not-a-token", f"Bearer {token}"):
            headers = {"Authorization": auth, "MCP-Protocol-Version": "2025-06-18"}
            r = await http.post(env.url, json=body, headers=headers)
            assert r.status_code == 503 and r.json()["error"]["code"] == -32010, r.text
            message = r.json()["error"]["message"]
            assert "audit store cannot take writes" in message and "nothing was sent to Proxmox" in message
            assert not [s for s in secrets_of_the_store if s in message], message
        # the operator still learns why: /admin/health (admin token) keeps the store's words
        admin_token = (env.workdir / "secrets" / "admin-token").read_text().strip()
        base = env.url.rsplit("/mcp", 1)[0]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            doc = (await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {admin_token}"})).json()
            if name in str(doc):
                break
            await asyncio.sleep(0.2)
        assert name in str(doc), doc
