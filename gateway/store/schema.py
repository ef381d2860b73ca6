"""`pvegate db upgrade`: every store's migrations for the backend storage.url selects.

On SQLite the gateway keeps quota counters (store/usage.py) and pool holds (store/holds.py) in the
process, so only the audit and approval tables, the request-state key (store/shared_keys.py) and
the retry handoffs (store/handoffs.py) live in the file; on PostgreSQL all of them are shared by the replicas.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.store import approvals, audit, handoffs, holds, shared_keys, usage
from gateway.store.db import Database
from gateway.store.migrations import upgrade

COMPONENTS: dict[str, dict[str, dict[str, Sequence[str]]]] = {
    "sqlite": {
        "audit": audit.MIGRATIONS,
        "approvals": approvals.MIGRATIONS,
        "keys": shared_keys.MIGRATIONS,
        "handoffs": handoffs.MIGRATIONS,
    },
    "postgresql": {
        "audit": audit.MIGRATIONS,
        "approvals": approvals.MIGRATIONS,
        "usage": usage.MIGRATIONS,
        "holds": holds.MIGRATIONS,
        "keys": shared_keys.MIGRATIONS,
        "handoffs": handoffs.MIGRATIONS,
    },
}


async def upgrade_all(db: Database) -> list[tuple[str, int, int]]:
    """Apply what is missing to an open database: (component, version before, version after) each."""
    return [(name, *await upgrade(db, name, migrations)) for name, migrations in COMPONENTS[db.kind].items()]
