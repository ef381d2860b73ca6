"""The approvals store's tables, per backend: data only, so the audit's `verify` can know every table
the SQLite file may hold without importing the store (which imports the audit)."""

from __future__ import annotations

from collections.abc import Sequence

# Version 1 of the SQLite schema is the one every earlier release created (IF NOT EXISTS: it
# applies cleanly to such a database); store/migrations.py records the version.
SQLITE_V1 = """
CREATE TABLE IF NOT EXISTS approval_requests (
    id               TEXT PRIMARY KEY,
    created_at       REAL NOT NULL,
    request_id       TEXT NOT NULL,
    requester        TEXT NOT NULL,
    requester_facts  TEXT NOT NULL,
    tool             TEXT NOT NULL,
    tool_facts       TEXT NOT NULL,
    arguments_digest TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    target_key       TEXT NOT NULL,
    target           TEXT NOT NULL,
    risk             TEXT NOT NULL,
    reason           TEXT NOT NULL,
    approver_groups  TEXT NOT NULL,
    min_approvals    INTEGER NOT NULL,
    ttl_seconds      INTEGER NOT NULL,
    expires_at       REAL NOT NULL,
    state            TEXT NOT NULL,
    decided_at       REAL,
    decided_by       TEXT,
    note             TEXT,
    token_hash       TEXT UNIQUE,
    token_expires_at REAL,
    used_at          REAL,
    used_by_request  TEXT
);
CREATE INDEX IF NOT EXISTS approval_lookup
    ON approval_requests(requester, tool, arguments_digest, target_key, state);
CREATE INDEX IF NOT EXISTS approval_state ON approval_requests(state, expires_at);
CREATE TABLE IF NOT EXISTS approval_votes (
    request_id      TEXT NOT NULL REFERENCES approval_requests(id),
    approver        TEXT NOT NULL,
    approver_facts  TEXT NOT NULL,
    verdict         TEXT NOT NULL,
    at              REAL NOT NULL,
    opa_decision_id TEXT,
    note            TEXT,
    PRIMARY KEY (request_id, approver)
);
"""

POSTGRES_V1 = """
CREATE TABLE IF NOT EXISTS approval_requests (
    id               TEXT PRIMARY KEY,
    created_at       DOUBLE PRECISION NOT NULL,
    request_id       TEXT NOT NULL,
    requester        TEXT NOT NULL,
    requester_facts  TEXT NOT NULL,
    tool             TEXT NOT NULL,
    tool_facts       TEXT NOT NULL,
    arguments_digest TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    target_key       TEXT NOT NULL,
    target           TEXT NOT NULL,
    risk             TEXT NOT NULL,
    reason           TEXT NOT NULL,
    approver_groups  TEXT NOT NULL,
    min_approvals    INTEGER NOT NULL,
    ttl_seconds      INTEGER NOT NULL,
    expires_at       DOUBLE PRECISION NOT NULL,
    state            TEXT NOT NULL,
    decided_at       DOUBLE PRECISION,
    decided_by       TEXT,
    note             TEXT,
    token_hash       TEXT UNIQUE,
    token_expires_at DOUBLE PRECISION,
    used_at          DOUBLE PRECISION,
    used_by_request  TEXT
);
CREATE INDEX IF NOT EXISTS approval_lookup
    ON approval_requests(requester, tool, arguments_digest, target_key, state);
CREATE INDEX IF NOT EXISTS approval_state ON approval_requests(state, expires_at);
CREATE TABLE IF NOT EXISTS approval_votes (
    request_id      TEXT NOT NULL REFERENCES approval_requests(id),
    approver        TEXT NOT NULL,
    approver_facts  TEXT NOT NULL,
    verdict         TEXT NOT NULL,
    at              DOUBLE PRECISION NOT NULL,
    opa_decision_id TEXT,
    note            TEXT,
    PRIMARY KEY (request_id, approver)
);
"""

MIGRATIONS: dict[str, Sequence[str]] = {"sqlite": [SQLITE_V1], "postgresql": [POSTGRES_V1]}
