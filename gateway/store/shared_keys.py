"""Keys every replica must share: the one that seals request states and session ids.

A requestState minted by one replica is echoed back on a retry that the load balancer may send
to any other, so the sealing key cannot be made per process. It comes from `state_key` in the
configuration (a secret file or variable, the same on every replica) or, when that is not set,
from the database: the first process to start creates it (INSERT ... ON CONFLICT DO NOTHING)
and every process then reads the one row that won, so concurrent first starts agree.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from gateway.core.config import Config, ConfigError
from gateway.store.db import Database, database
from gateway.store.migrations import check

STATE_KEY = "request-state"  # the row's name: requestStates and legacy session ids
MIN_KEY_CHARS = 32  # e.g. `openssl rand -hex 32` (64 characters); 32 hex characters are 128 bits

_TABLE = (
    "CREATE TABLE IF NOT EXISTS pvegate_keys (name TEXT PRIMARY KEY, value TEXT NOT NULL, created_at {real} NOT NULL)"
)
MIGRATIONS: dict[str, Sequence[str]] = {
    "sqlite": [_TABLE.format(real="REAL")],
    "postgresql": [_TABLE.format(real="DOUBLE PRECISION")],
}


def configured_key(config: Config) -> bytes | None:
    """state_key's bytes, validated; None when it is not set (the database holds the key)."""
    if config.state_key is None:
        return None
    text = config.state_key.read()  # ConfigError (one line) when the file or variable is missing
    if len(text) < MIN_KEY_CHARS:
        raise ConfigError(
            f"state_key: the key is {len(text)} characters, at least {MIN_KEY_CHARS} are needed "
            "(make one with `openssl rand -hex 32`)"
        )
    return text.encode()


async def shared_key(db: Database, name: str = STATE_KEY) -> bytes:
    """The key named `name` in the open database, created once (the first writer wins)."""
    candidate = secrets.token_hex(32)
    async with db.transaction() as tx:
        await tx.execute(
            "INSERT INTO pvegate_keys (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
            name,
            candidate,
            time.time(),
        )
        # READ COMMITTED: a concurrent first insert made the one above wait and do nothing; this
        # statement's snapshot sees the row that won
        rows = await tx.fetch("SELECT value FROM pvegate_keys WHERE name = ?", name)
    return str(rows[0]["value"]).encode()


async def state_key(config: Config) -> bytes:
    """The request-state key: from state_key if configured, else the database storage.url names."""
    key = configured_key(config)
    if key is not None:
        return key
    db = database(config)
    await db.open()
    try:
        await check(db, "keys", MIGRATIONS)
        return await shared_key(db)
    finally:
        await db.close()
