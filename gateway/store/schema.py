"""`pvegate db upgrade`: every store's migrations for the backend storage.url selects.

On SQLite the gateway keeps quota counters in the process (store/usage.py), so only the
approval tables live in the file; on PostgreSQL both are shared by the replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store import approvals, usage
from gateway.store.db import Database
from gateway.store.migrations import upgrade

COMPONENTS: dict[str, dict[str, dict[str, Sequence[str]]]] = {
    "sqlite": {"approvals": approvals.MIGRATIONS},
    "postgresql": {"approvals": approvals.MIGRATIONS, "usage": usage.MIGRATIONS},
}


async def upgrade_all(db: Database) -> list[tuple[str, int, int]]:
    """Apply what is missing to an open database: (component, version before, version after) each."""
    return [(name, *await upgrade(db, name, migrations)) for name, migrations in COMPONENTS[db.kind].items()]
