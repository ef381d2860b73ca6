"""PostgreSQL: `pvegate db upgrade`'s DDL must bind the catalog's types, functions and operators, never an object
someone with CREATE on pvegate's schema planted there under a built-in's name.

The migrations name `TEXT` unqualified (a type name looked up through search_path, unlike the keywords BIGINT,
INTEGER, DOUBLE PRECISION). With pvegate's schema searched before pg_catalog during the upgrade, a domain
`<schema>.text` whose CHECK calls a function of the planter's would become the type of every text column:
each value written (audit bodies, approval arguments) would then pass through that function."""

from __future__ import annotations

import asyncpg

from gateway.store.db import PostgresDatabase
from gateway.store.schema import upgrade_all
from tests.pgserver import PostgresServer

# a domain that shadows pg_catalog.text in the schema the upgrade creates its tables in (public here), and copies
# every value checked against it into a table of the planter's
PLANT = """
CREATE TABLE public.leaked (value pg_catalog.text);
CREATE FUNCTION public.leak(v pg_catalog.text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN INSERT INTO public.leaked (value) VALUES (v); RETURN true; END $$;
CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.leak(VALUE))
"""

# the columns of pvegate's tables whose type is not the catalog's own
FOREIGN_TYPES = """
SELECT c.relname || '.' || a.attname AS col, format_type(a.atttypid, a.atttypmod) AS type
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace cn ON cn.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
WHERE cn.nspname = 'public' AND c.relkind = 'r' AND c.relname <> 'leaked' AND a.attnum > 0
  AND NOT a.attisdropped AND t.typnamespace <> 'pg_catalog'::regnamespace
ORDER BY 1
"""


async def test_upgrade_ddl_binds_the_catalogs_text_not_a_planted_domain(postgres: PostgresServer) -> None:
    url = await postgres.create_database("sp_")
    admin = await asyncpg.connect(url)
    try:
        await admin.execute(PLANT)
        db = PostgresDatabase(url)
        await db.open()
        try:
            done = await upgrade_all(db)
            assert all(after > 0 for _, _, after in done)
            # the tables were made in pvegate's schema, not pg_catalog
            assert await admin.fetchval("SELECT to_regclass('public.audit') IS NOT NULL")
            assert await admin.fetchval("SELECT to_regclass('public.pvegate_schema') IS NOT NULL")
            async with db.transaction() as tx:
                await tx.execute(
                    "INSERT INTO pvegate_keys (name, value, created_at) VALUES (?, ?, ?)", "k", "secret", 1.0
                )
        finally:
            await db.close()
        assert [tuple(r) for r in await admin.fetch(FOREIGN_TYPES)] == []
        assert await admin.fetch("SELECT value FROM public.leaked") == []
    finally:
        await admin.close()
