"""Which storage backend `storage.url` selects, and what is not yet shared through PostgreSQL.

Several replicas are only correct if every piece of state a call depends on is shared: the
audit chain, pending approvals and their one-time tokens, the quota counters, and the keys
that seal request states and session ids. Until each is ported (issue #15), a PostgreSQL URL
is refused at start: running with some state per process while the operator believes it
shared would let a token be redeemed twice or a quota be exceeded N-fold.
"""

from __future__ import annotations

from gateway.core.config import Config, ConfigError

# What must be shared across replicas and still lives per process or in a local SQLite file.
# Ported (store/db.py): approvals (store/approvals.py), quota counters (store/usage.py), the
# request-state and session signing key (store/shared_keys.py), and the audit log with its head
# key (store/audit.py: one chain, the key file given to every replica). Nothing is left; the check
# stays for whatever state is added next.
NOT_YET_SHARED: tuple[str, ...] = ()


def refuse_unshared(config: Config) -> None:
    """ConfigError (one line) when storage.url selects PostgreSQL before every shared store is ported."""
    if config.storage.postgresql and NOT_YET_SHARED:
        raise ConfigError(
            f"storage.url: PostgreSQL is not supported yet: {', '.join(NOT_YET_SHARED)} would stay per "
            "process, not shared by the replicas (issue #15); leave storage.url unset (SQLite) until then"
        )
