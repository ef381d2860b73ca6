"""A pool hold outlives the longest call that can hold it (store/holds.py), on the replicas' PostgreSQL.

A restore into a pool (vm_restore, lxc_restore) holds what it asks for before its second decision, and
then waits on its Proxmox task for up to its task_timeout: the shipped restores wait an hour, the most a
connector may ask (connector.schema.json). Proxmox lists the restored guest in its pool only when the
task ends, so until then the hold is all that counts it. Holds lapsed an hour after they were taken: an
hour-long restore's hold lapsed before its wait was over, and before reconciliation (which renews the hold
of a call whose task still runs: every pass on its own replica, or the others' once its replica is gone)
could renew it; any create on the pool meanwhile swept the row, and the pool's limit could be passed by
another replica's create while the restore still ran.
"""

from __future__ import annotations

import json

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit import REPLICA_STALE_SECONDS
from gateway.store.db import PostgresDatabase
from gateway.store.holds import SqlHolds
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database

RECONCILE_INTERVAL_SECONDS = 10.0  # reconcile_loop's pass interval (store/reconcile.py)
# around the task wait: the second decision, the decision's commit, the POST that starts the task, the
# result's record (each bounded by its own timeout, a minute at most together)
AROUND_THE_WAIT_SECONDS = 60.0


def longest_task_wait() -> float:
    schema = json.loads((REPO_ROOT / "gateway" / "schemas" / "connector.schema.json").read_text())
    found: list[float] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            spec = node.get("task_timeout")
            if isinstance(spec, dict) and "maximum" in spec:
                found.append(float(spec["maximum"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    assert found, "connector.schema.json names no task_timeout maximum"
    return max(found)


async def test_a_hold_lapses_only_after_the_longest_call_and_its_reconciliation_could_renew_it(
    postgres: PostgresServer,
) -> None:
    url = await new_pg_database(postgres, "h_")
    holds = SqlHolds(PostgresDatabase(url))  # as build_holds makes it: the default TTL
    await holds.open()
    try:
        _, handle = await holds.take("default", "sandbox", {"guests": 1, "cores": 2, "memory_mib": 512, "disk_gib": 8})
        rows = await holds.database.fetch(
            "SELECT expires_at - extract(epoch FROM clock_timestamp())::float8 AS left_s FROM pool_holds WHERE id = ?",
            handle,
        )
        left = float(rows[0]["left_s"])
        needed = longest_task_wait() + AROUND_THE_WAIT_SECONDS + REPLICA_STALE_SECONDS + RECONCILE_INTERVAL_SECONDS
        assert left >= needed, f"a hold lapses {left:.0f} s after it is taken; a call may hold it {needed:.0f} s"
    finally:
        await holds.close()
