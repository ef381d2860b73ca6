"""PostgreSQL: an operator that shadows a catalog one, put first by a role's or database's search_path, must
neither hide records from filtered reads nor pass verify.

`CREATE OPERATOR public.= (text, text)` with `search_path = public, pg_catalog` would make `principal = $1`
call the forged operator: search, export, replay and reconcile would see fewer records while verify's full
scan (no comparison on text) says the chain is whole. pvegate pins every connection's search_path to
`pg_catalog, <its schema>, pg_temp`, and verify names such an operator or function."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord, Query
from gateway.store.db import PostgresDatabase
from gateway.store.pgsync import PgLocation
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database, off

FORGE_EQ = (
    "CREATE FUNCTION public.never_eq(text, text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT false $$; "
    "CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.never_eq); "
    "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = public, pg_catalog', current_database()); END $$"
)


async def _sql(url: str, stmt: str) -> None:
    con = await asyncpg.connect(url)
    try:
        await con.execute(stmt)
    finally:
        await con.close()


async def _filled(postgres: PostgresServer, key: Path) -> str:
    url = await new_pg_database(postgres, key=key)
    log = AuditLog(PgLocation(url), head_key=key)
    await log.open()
    try:
        for i in range(4):
            await log.append(AuditRecord(f"r{i}", "decision", "alice", "delete_vm", "default/qemu/100", "allow", {}))
    finally:
        await log.close()
    return url


async def test_a_shadowing_operator_does_not_hide_records_from_filtered_reads(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    key = tmp_path / "audit-head.key"
    url = await _filled(postgres, key)
    where = PgLocation(url)
    assert len(off(auditlib.search, where, Query(principal="alice"))) == 4
    await _sql(url, FORGE_EQ)
    # the operator side (PgConnection) and the gateway's pool both compare with the catalog's operator
    assert len(off(auditlib.search, where, Query(principal="alice"))) == 4
    db = PostgresDatabase(url)
    await db.open()
    try:
        rows = await db.fetch("SELECT seq FROM audit WHERE principal = ?", "alice")
        assert len(rows) == 4
        # the pin survives a pooled connection's reset (RESET ALL between transactions)
        rows = await db.fetch("SELECT seq FROM audit WHERE principal = ?", "alice")
        assert len(rows) == 4
    finally:
        await db.close()


async def test_a_shadowing_operator_or_function_fails_verify(postgres: PostgresServer, tmp_path: Path) -> None:
    key = tmp_path / "audit-head.key"
    url = await _filled(postgres, key)
    where = PgLocation(url)
    assert off(auditlib.verify, where, key=key).ok
    await _sql(url, FORGE_EQ)
    res = off(auditlib.verify, where, key=key)
    assert not res.ok and "operator public.=(text, text)" in (res.problem or ""), res.problem
    await _sql(url, "DROP OPERATOR public.= (text, text)")
    assert off(auditlib.verify, where, key=key).ok
    await _sql(url, "CREATE FUNCTION public.lower(text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT '' $$")
    res = off(auditlib.verify, where, key=key)
    assert not res.ok and "function public.lower(text)" in (res.problem or ""), res.problem
