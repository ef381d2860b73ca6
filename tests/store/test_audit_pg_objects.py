"""PostgreSQL: `audit` and `audit_meta`, as readers name them, must be the ordinary tables pvegate makes.

A view in the table's place, a rule, a trigger, row-level security, a changed column or a schema earlier
in the search_path could show search, export, the admin API and replay other rows than verify's full scan
(which names the table the same way): verify fails naming the object, and a replica refuses to start."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from gateway.store import audit as auditlib
from gateway.store.audit import AuditIntegrityError, AuditLog, AuditRecord
from gateway.store.pgsync import PgLocation
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database, off

TAMPERS = {
    "view": (
        "ALTER TABLE audit RENAME TO audit_rows; "
        "CREATE VIEW audit AS SELECT * FROM audit_rows WHERE principal IS DISTINCT FROM 'mallory'",
        "audit is a view (public.audit)",
    ),
    "rule": (
        "CREATE RULE hide AS ON INSERT TO audit WHERE NEW.principal = 'mallory' DO INSTEAD NOTHING",
        "the audit table has a rule (hide)",
    ),
    "trigger": (
        "CREATE FUNCTION scrub() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.body := '{}'; RETURN NEW; END $$; "
        "CREATE TRIGGER t_scrub BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION scrub()",
        "the audit table has a trigger (t_scrub)",
    ),
    "rls": (
        "CREATE POLICY p ON audit USING (principal IS DISTINCT FROM 'mallory'); "
        "ALTER TABLE audit ENABLE ROW LEVEL SECURITY; ALTER TABLE audit FORCE ROW LEVEL SECURITY",
        "row-level security is enabled on the audit table",
    ),
    "meta_view": (
        "ALTER TABLE audit_meta RENAME TO meta_rows; CREATE VIEW audit_meta AS SELECT * FROM meta_rows",
        "audit_meta is a view (public.audit_meta)",
    ),
    "column": ("ALTER TABLE audit ADD COLUMN note text", "the audit table's columns are not the ones pvegate makes"),
    "shadow": (
        "CREATE SCHEMA shadow; "
        "CREATE VIEW shadow.audit AS SELECT * FROM public.audit WHERE principal IS DISTINCT FROM 'mallory'; "
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET search_path = shadow, public', current_database()); END $$",
        "audit is a view (shadow.audit)",
    ),
}


async def _sql(url: str, stmt: str) -> None:
    con = await asyncpg.connect(url)
    try:
        await con.execute(stmt)
    finally:
        await con.close()


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
async def test_a_foreign_object_in_place_of_the_audit_tables_fails_verify_and_start(
    postgres: PostgresServer, tmp_path: Path, tamper: str
) -> None:
    key = tmp_path / "audit-head.key"
    url = await new_pg_database(postgres, key=key)
    where = PgLocation(url)
    log = AuditLog(where, head_key=key)
    await log.open()
    try:
        for i in range(4):
            who = "mallory" if i % 2 else "alice"
            await log.append(AuditRecord(f"r{i}", "decision", who, "delete_vm", "default/qemu/100", "allow", {}))
    finally:
        await log.close()
    assert off(auditlib.verify, where, key=key).ok
    stmt, words = TAMPERS[tamper]
    await _sql(url, stmt)
    res = off(auditlib.verify, where, key=key)
    assert not res.ok and words in (res.problem or ""), res.problem
    log = AuditLog(where, head_key=key)
    with pytest.raises(AuditIntegrityError, match="run `pvegate audit verify`"):
        await log.open()
    await log.close()
