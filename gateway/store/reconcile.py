"""Reconciliation: settle every allowed call whose outcome the audit does not hold.

A call is *open* when it has an `allow` decision and no settling record: no `result`
with outcome `ok`, `failed`, `upstream_error` (nothing was sent) or `reconciled`, no
`interrupted` result that needs no follow-up, no post-decision `refusal`. That happens when the gateway died (SIGKILL, a
crash, power) or was cut off by a drain while it waited on Proxmox.

For each open call, oldest first:
- a read, or a dry run: nothing changed in Proxmox; it gets an `interrupted` result
  saying so (`pending_reconcile: false`).
- a mutation with a recorded UPID (its `dispatch` or `interrupted` record): the task's
  status on its node. Finished: a `reconciled` result with what Proxmox says (`ok`, or
  `failed` and its exit status). Still running: left open for the next pass.
- a mutation without a UPID (the gateway died between Proxmox's answer and the dispatch
  record, or before sending), of a tool that starts a task: the node's task list, one
  `typefilter` per task type the tool declares (`task_type`), for the gateway's token, that
  guest, around the decision time (Reconciler.task_window: CLOCK_SKEW_SECONDS either side),
  minus the UPIDs other records already claim (read from CLAIM_MARGIN_SECONDS before the
  earliest call settled, whatever pass it is); each row's UPID checked again, whole (type,
  user exactly the token id: `userfilter` is a substring match, worker id: the guest's vmid,
  or the tool's `task_worker_id` filled from the call, e.g. `103@local` for a prune, with no
  `vmid` filter sent then; a volume deletion's, `imgdel`: its owner (target.volume_of) and storage,
  `103@local`, or `local` for a volume nobody owns, and a record that does not say whose volume it is
  is `reconciled` with `proxmox: unverifiable` and the reason, never matched to a task that may be
  another deletion's; start time). Found, and no other call may own it (Reconciler._rivals: one of the
  same type, node and worker id, around its start, whose records name no task and do not say none was
  started: two restarts or apt refreshes on one node, two deletions of one guest's backups, a previous
  run's call whose task is not recorded): as above (`found_by: task_list`); else `reconciled` with
  `proxmox: unverifiable`, the task (`candidate`) and the other calls (`rivals`), never a guess that could
  give each the other's outcome (left open while a rival is still in flight here).
  Nothing: `reconciled` with `proxmox: not_found` (the request
  never reached Proxmox, or Proxmox refused it before starting a task). A call that names no
  node is looked for on every node the cluster lists; while one of them is not online (its
  task list cannot be read, and the task may be there) the call is left open, never
  `not_found`.
- a mutation decided before the look-back (LOOKBACK_SECONDS, 7 days: about as long as
  Proxmox keeps its task history): its recorded UPID's status as above if Proxmox still
  answers for it; else (no UPID, or one Proxmox no longer knows) `reconciled` with `proxmox:
  unverifiable`, `past_lookback: true` and the reason. Never searched for (nothing found would
  read as "it did not happen"), never left open to drop out of sight.
- a mutation without a UPID of a tool Proxmox answers at once, without a task (`synchronous:
  true`): never searched for (any task found would be another call's); `reconciled` with
  `proxmox: unverifiable` and the reason: it cannot be looked up, so it is not called
  `not_found`. A tool this catalog no longer has: the same, its task type being unknown. (SSH
  tools only read: the catalog refuses others.)
- a mutation on a cluster the configuration no longer names: `reconciled` with `proxmox:
  unverifiable` and the reason (nobody here can ask that Proxmox; see Reconciler.settle).
If Proxmox cannot be asked, the call stays open and is tried again later.

The gateway runs this at start-up for the calls earlier runs left open (then again, with
back-off, while some are left open); `pvegate audit reconcile` runs it by hand (the calls
decided in its look-back, `--since`, and before `--min-age`). Which calls are earlier runs'
is never judged by the time on their records: before it serves its first call the gateway
reads every call the audit holds open (Reconciler.read_earlier), all of them earlier runs'
(this process has decided nothing yet; on PostgreSQL a live replica's stay its own, below),
and its passes settle those, by request id, whatever their time (a clock stepped back between
a crash and the restart stamps the crashed run's calls after the restart). That read covers
the look-back (by the time index); the first pass adds, once, the calls decided before it (a
scan of the audit's whole past, off the start-up path). Only if that read fails does the
first pass take, instead, the calls decided before this process's start by the time on them.
Calls of earlier runs still open never hold up the rest: the same loop settles this process's
own interrupted calls (by id too) and (PostgreSQL) those of replicas that are gone every
`interval` meanwhile. Its last pass, the calls it left open and whether its task still runs are
what health (/readyz, /admin/health) and /metrics report (Reconciler.status).

Several replicas on PostgreSQL share one audit, so a call open in the audit may be one another
replica is still running. Every decision (and dispatch) record names its replica, and every
replica refreshes its row in `audit_replicas` as it commits (at least every probe interval). A
call belongs to its replica while that replica's row is fresh (REPLICA_STALE_SECONDS, by the
database's clock): nobody else touches it (`in_flight`). Once the row is stale (the replica was
killed, lost the database, or stopped: a clean stop marks its row stale at once), the first
replica that holds the `pvegate-reconcile` advisory lock claims it (AuditLog.claim_gone: a row
renewed meanwhile, even by a heartbeat not yet committed, is not taken; a row already claimed is
taken again only by the lock's holder), settles its calls, then forgets the row once none of its
calls is left open. Its calls are selected whatever the time on their records: each record carries
its writer's clock, and a replica whose clock ran ahead must not be forgotten with its last calls
open. (Since the look-back, though: a call of a gone replica still open past it, its task running
or its Proxmox away for days, is left to the next start of any replica, whose pass over the
audit's whole past finds it.) A replica that was only paused refuses what it decided before
(AuditLog.hold). Calls with no replica named (written on SQLite, or moved from it) follow the
single-host rule.

Every pass runs under that lock: the replicas' and `pvegate audit reconcile`'s (which waits for
its turn). The lock is a session lock on one pooled connection, which a cut connection (a network
blip, a restart, pg_terminate_backend) frees without telling its holder; so right before each
settling result the pass asks, in one statement on that connection, whether it still holds the lock
and whether the call has been settled meanwhile (Turn.confirm, SETTLED_SQL). A lost lock ends the
pass (the rest is left `open`, for the lock's new holder); a call settled meanwhile, by its own
replica or by another pass, gets nothing more (`already_settled`). What is left is the time between
that statement and the commit of the result (one group commit); SQLite (one host, no lock) has the
same check, against a `pvegate audit reconcile` run beside a running gateway.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gateway.core import text
from gateway.core.config import Config, ConfigError
from gateway.core.redaction import REDACTED
from gateway.store import audit as auditlib
from gateway.store import db
from gateway.store.audit import AuditRecord
from gateway.store.holds import AMOUNTS, PoolHolds
from gateway.store.outcomes import STORE_ERRORS, AuditUnavailable, Outcomes
from gateway.store.pgsync import PgLocation
from gateway.store.settling import OPEN_CALLS_SQL, settles
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import ToolError
from gateway.tools.runtimes.pve_api import UPID_RE, PveApiClient, upid_node
from gateway.tools.tool import PLACEHOLDER, Tool

log = logging.getLogger("pvegate.reconcile")

# (cluster, pool, amounts): a call's hold on its pool, as its decision record shows it
PoolHold = tuple[str, str, dict[str, int]]

LOOKBACK_SECONDS = 7 * 86400  # Proxmox keeps its task history about this long by default
TASK_LIST_LIMIT = 500
# How far the gateway's clock may be from a Proxmox node's when a call's task is looked for in the node's
# task list (decision times are the gateway's clock, task start times the node's): Reconciler.task_window.
CLOCK_SKEW_SECONDS = 120
# How far before the earliest call a pass settles the records naming UPIDs (claimed_tasks) are read: why, with
# the archive that keeps them, at auditlib.CLAIM_MARGIN_SECONDS.
CLAIM_MARGIN_SECONDS = auditlib.CLAIM_MARGIN_SECONDS

# The task type of a volume deletion, whose worker id is the volume's owner and storage (volume_worker_id), not
# the target's vmid (it has none) nor a `task_worker_id` form: PVE's id depends on what the volume's name says.
VOLUME_TASK = "imgdel"

RECONCILE_LOCK = "pvegate-reconcile"  # one reconciler at a time among the replicas (AuditLog.exclusive)


# The same for one request id, whatever its time (`audit_request`): a pass over calls known by id reads no range.
OPEN_CALL_SQL = f"""
SELECT d.seq, d.request_id, d.ts, d.principal, d.tool, d.target FROM audit d
WHERE d.request_id = ? AND d.kind = 'decision' AND d.outcome = 'allow'
AND NOT EXISTS (SELECT 1 FROM audit r WHERE {settles("d.request_id", "d.seq")})
"""  # noqa: S608 - fixed text
# Whether the call decided in record ? (its request id ?) has a settling record by now: asked right before a
# settling result is written, in the same statement as the check that the reconcile lock is still held.
SETTLED_SQL = f"SELECT count(*) FROM audit r WHERE {settles('?', '?')}"  # noqa: S608 - fixed text
# Bodies are matched as the writer prints them (dumps_body: sorted keys, no spaces; a quote inside a
# string value is escaped, so client text cannot fake a key), never parsed in SQL: one body edited
# into something that is not JSON would make json_extract / ::json fail every pass, for every call.
CLAIMED_SQL = """
SELECT body FROM audit WHERE ts >= ? AND kind IN ('dispatch', 'result') AND body LIKE '%"task_id":"%'
"""
PG_OPEN_CALLS_SQL = OPEN_CALLS_SQL
# Allowed calls decided in [?, ?] (not call ?) whose records do not say that no task was left unnamed: see
# rival_calls. Those whose records name a task id are dropped after reading them (the id may be in any record).
RIVALS_SQL = """
SELECT d.seq, d.request_id, d.ts, d.principal, d.tool, d.target FROM audit d
WHERE d.kind = 'decision' AND d.outcome = 'allow' AND d.ts >= ? AND d.ts <= ? AND d.request_id <> ?
AND NOT EXISTS (SELECT 1 FROM audit r WHERE r.request_id = d.request_id AND r.seq > d.seq AND (
    r.kind = 'refusal'
    OR (r.kind = 'result' AND (
        r.outcome IN ('ok', 'failed', 'upstream_error')
        OR (r.outcome = 'interrupted' AND r.body LIKE '%"pending_reconcile":false%')))))
ORDER BY d.seq
"""
PG_CLAIMED_SQL = CLAIMED_SQL


@dataclass
class OpenCall:
    request_id: str
    ts: float
    principal: str | None
    tool: str | None
    target_key: str | None
    target: dict[str, Any] = field(default_factory=dict)
    effect: str | None = None
    dry_run: bool = False
    task_id: str | None = None
    dispatched: bool = False
    owner: str | None = None  # the replica that decided it (PostgreSQL); None: written on SQLite
    unreadable: int | None = None  # seq of a record whose body is not JSON (edited outside the gateway)
    seq: int = 0  # its decision record
    arguments: dict[str, Any] = field(default_factory=dict)  # as the audit kept them (redacted where it must)
    hold: PoolHold | None = None  # what it held on its pool when it was decided (an allowed allocating call)


@dataclass
class Settled:
    request_id: str
    tool: str | None
    # reconciled | interrupted | open | in_flight (a live replica's call: not touched) | already_settled
    # (a settling record was written meanwhile, by its replica or another pass: nothing written)
    action: str
    proxmox: str | None = None  # ok | failed | not_found | unverifiable | running | unreachable
    task_id: str | None = None
    detail: str | None = None
    owner: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def open_calls(
    path: Path | PgLocation, since: float | None, before: float | None, only: set[str] | None = None
) -> list[OpenCall]:
    """The open calls decided in [since, before) (None: no bound on that side), or, given `only`, those of
    these request ids whatever their time (each read by its index); oldest first, read on a connection of
    their own (never the writer's: a long look-back must not hold up the calls being audited meanwhile)."""
    con = auditlib.connect(path, readonly=True)
    sql = PG_OPEN_CALLS_SQL if isinstance(path, PgLocation) else OPEN_CALLS_SQL
    try:
        if only is not None:
            rows = [d for rid in sorted(only) for d in con.execute(OPEN_CALL_SQL, (rid,)).fetchall()]
            rows.sort(key=lambda d: int(d["seq"]))
        else:
            bounds = (-math.inf if since is None else since, math.inf if before is None else before)
            rows = con.execute(sql, bounds).fetchall()
        calls: list[OpenCall] = []
        for d in rows:
            calls.append(_read_call(con, d))
        return calls
    finally:
        con.close()


def _read_call(con: Any, d: Any) -> OpenCall:
    """A call as its records tell it, from its decision row `d`."""
    call = OpenCall(str(d["request_id"]), float(d["ts"]), d["principal"], d["tool"], d["target"])
    call.seq = int(d["seq"])
    related = con.execute("SELECT seq, kind, body FROM audit WHERE request_id = ? ORDER BY seq", (call.request_id,))
    for r in related.fetchall():
        # a body that is not JSON (edited outside the gateway) must not stall every other call's
        # pass; the call itself cannot be matched to Proxmox on half its facts (Reconciler.settle)
        kind, body = r["kind"], auditlib.body_or_empty(r["body"])
        if not body and (r["body"] or "").strip() not in ("", "{}"):
            call.unreadable = int(r["seq"])
        if kind == "received":
            call.target = _obj(body.get("target"))
            call.arguments = _obj(body.get("arguments"))
            call.effect = body.get("effect")
            call.dry_run = bool(body.get("dry_run"))
        elif kind == "decision":
            call.owner = body.get("replica")
            call.hold = held_by(auditlib.unpack_input(body))
            if _obj(body.get("obligations")).get("dry_run"):
                call.dry_run = True
        elif kind == "dispatch":
            call.dispatched = True
        if kind in ("dispatch", "result") and body.get("task_id"):
            call.task_id = str(body["task_id"])
    return call


def rival_calls(path: Path | PgLocation, since: float, until: float, exclude: str) -> list[OpenCall]:
    """The allowed calls decided in [since, until], other than `exclude`, that may have started a Proxmox task
    no record names: none of their records carries a task id, and none says nothing was sent or the call ended
    without a task (refusal; ok, failed, upstream_error; an interrupted read or dry run). Open ones, and those
    settled from the task list without a task (not_found, unverifiable). Read on a connection of their own."""
    con = auditlib.connect(path, readonly=True)
    try:
        rows = con.execute(RIVALS_SQL, (since, until, exclude)).fetchall()
        return [c for d in rows if (c := _read_call(con, d)).task_id is None and not c.dry_run]
    finally:
        con.close()


def _obj(value: Any) -> dict[str, Any]:
    """A record's field read as an object: anything else (a record edited outside the gateway) as none."""
    return value if isinstance(value, dict) else {}


def held_by(doc: dict[str, Any] | None) -> PoolHold | None:
    """The pool hold a decision's policy input shows its call took (its resources carry `pool_in_flight`
    only then: pipeline.py), as (cluster, pool, amounts); None for any other call, or an older record."""
    res = _obj(doc).get("resources")
    cluster = _obj(_obj(doc).get("target")).get("cluster")
    if not isinstance(res, dict) or "pool_in_flight" not in res or not isinstance(cluster, str):
        return None
    pool, requested = res.get("pool"), res.get("requested")
    if not isinstance(pool, str) or not isinstance(requested, dict):
        return None
    amounts = {k: v for k, v in requested.items() if k in AMOUNTS and isinstance(v, int) and not isinstance(v, bool)}
    return cluster, pool, amounts


def claimed_tasks(path: Path | PgLocation, since: float) -> set[str]:
    """UPIDs some record already names: never matched to another call."""
    con = auditlib.connect(path, readonly=True)
    sql = PG_CLAIMED_SQL if isinstance(path, PgLocation) else CLAIMED_SQL
    try:
        rows = con.execute(sql, (since,)).fetchall()
        return {str(b["task_id"]) for r in rows if (b := auditlib.body_or_empty(r[0])).get("task_id")}
    finally:
        con.close()


class Reconciler:
    def __init__(self, config: Config, catalog: Catalog, outcomes: Outcomes, clients: dict[str, PveApiClient]) -> None:
        self.config = config
        self.catalog = catalog
        self.outcomes = outcomes
        self.clients = clients
        self._users: dict[str, str | None] = {}
        # what the background loop did last, for health and metrics (never read on the hot path)
        self.task: asyncio.Task[None] | None = None
        self.last_pass_at: float | None = None  # wall time of the loop's last round without an error
        self.last_error: str | None = None  # the last round's failure, until a round succeeds
        self.earlier_open: int | None = 0  # earlier runs' calls left open by the last pass; None: it failed
        self.earlier_done = False  # none of those is left: only the periodic passes remain
        self.stale_open = 0  # gone replicas' calls left open by the last pass over them (PostgreSQL)
        self.restored: set[str] = set()  # earlier runs' calls whose pool holds read_earlier took again
        # the earlier runs' calls the pass over them is left to settle, by id (read_earlier); None: not read yet
        self.earlier: set[str] | None = None
        self.past_read = False  # those decided before the look-back were looked for (once: _earlier_pass)

    def open_calls(self) -> int | None:
        """Calls this process knows to be open: earlier runs', its own interrupted ones, gone replicas';
        None while the pass over earlier runs fails (unknown, never reported as zero)."""
        if self.earlier_open is None:
            return None
        return self.earlier_open + len(self.outcomes.unsettled) + self.stale_open

    def task_error(self) -> str | None:
        """Why the background task no longer runs; None while it runs (or was never started)."""
        task = self.task
        if task is None or not task.done():
            return None
        if task.cancelled():
            return "the reconciler task was cancelled"
        exc = task.exception()
        if exc is None:
            return "the reconciler task ended"
        text = str(exc)
        return f"the reconciler task died ({type(exc).__name__}{': ' + text[:200] if text else ''})"

    def status(self) -> dict[str, Any]:
        """The operator's view (/admin/health)."""
        return {
            "task_alive": self.task is not None and not self.task.done(),
            "task_error": self.task_error(),
            "last_pass_at": self.last_pass_at,
            "last_pass_age_seconds": None if self.last_pass_at is None else round(time.time() - self.last_pass_at, 3),
            "last_error": self.last_error,
            "open_calls": self.open_calls(),
            "open": {
                "earlier_runs": self.earlier_open,
                "own_interrupted": len(self.outcomes.unsettled),
                "stale_replicas": self.stale_open,
            },
            "earlier_runs_settled": self.earlier_done,
        }

    def start(self, before: float, interval: float = 10.0) -> asyncio.Task[None]:
        """Run reconcile_loop in the background; its end (it never ends on its own) is logged and
        turns readiness red (health.py), so a dead reconciler is never silent."""
        self.task = asyncio.create_task(reconcile_loop(self, before, interval), name="reconcile")
        self.task.add_done_callback(_log_end)
        return self.task

    async def read_earlier(self, before: float, holds: PoolHolds | None = None) -> int:
        """Before the first call is served (`before`: this run's start): the calls the audit holds open, for
        the pass over earlier runs to settle by id (`earlier`). This process has decided nothing yet, so every
        one of them is an earlier run's (or, PostgreSQL, a replica's: the owner rules of run_once apply),
        whatever the time on its records: a clock stepped back between a crash and this start stamps the
        crashed run's calls after this start, and a bound by time would leave them open for ever. Read from
        the look-back on (the audit_ts index); those decided before it are looked for once by the first pass,
        off the start-up path (_earlier_pass: a scan of the audit's whole past).

        With `holds` (SQLite: they live in the process, and a restart, a crash or a drain that cut calls
        whose tasks still run, forgot them) the pool holds of those calls are taken again, so a pool does
        not look emptier than what its running creates will make it. Each is kept as a call's own (renewed
        while its task runs, given back when reconciliation settles the call, here or by hand:
        forget_restored) and lapses like any other. How many were taken. An audit that cannot be read here is
        logged, not fatal: the pass over earlier runs then reads their calls itself, by time (decided before
        `before`), the passes say so in health if they fail too, and a gateway that does not start serves no
        one; the pools then count only what Proxmox lists until those calls settle."""
        try:
            calls = await asyncio.to_thread(open_calls, self.outcomes.audit.path, before - LOOKBACK_SECONDS, None)
        except Exception as exc:
            log.error("reconcile: the open calls of earlier runs could not be read at start-up (%s)", exc)
            return 0
        self.earlier = {c.request_id for c in calls}
        if holds is None:
            return 0
        try:
            for call in calls:
                if call.hold is not None and not call.dry_run and call.effect != "read":
                    cluster, pool, amounts = call.hold
                    await holds.take(cluster, pool, amounts, call.request_id)
                    self.restored.add(call.request_id)
        except Exception as exc:
            log.error("reconcile: the pool holds of earlier runs' open calls could not be taken again (%s)", exc)
        if self.restored:
            log.info("reconcile: %d pool hold(s) of earlier runs' open calls taken again", len(self.restored))
        return len(self.restored)

    async def forget_restored(self, settled: list[Settled]) -> None:
        """After a pass over earlier runs' calls: give back the restored holds of calls it no longer
        found open (settled meanwhile by `pvegate audit reconcile`, or by this pass: given back twice
        is harmless)."""
        still = {s.request_id for s in settled if s.action in ("open", "in_flight")}
        for request_id in self.restored - still:
            await self._tell(self.outcomes.on_settled, request_id)
        self.restored &= still

    def token_user(self, cluster: str) -> str | None:
        """The user Proxmox records on the gateway's tasks: the token id, without its secret."""
        if cluster not in self._users:
            try:
                self._users[cluster] = self.config.clusters[cluster].token.read().split("=", 1)[0]
            except (ConfigError, OSError, KeyError):
                self._users[cluster] = None
        return self._users[cluster]

    async def run_once(
        self,
        before: float,
        since: float | None = None,
        only: set[str] | None = None,
        owners: set[str] | None = None,
        turn: auditlib.Turn | None = None,
        own: bool = False,
    ) -> list[Settled]:
        """Settle the open calls decided in [since, before); or those of these ids (`only`, whatever their time:
        the earlier runs' calls read at start-up, or, with `own`, this replica's own); or those of these (stale)
        replicas (`owners`: decided since `since`, whatever their time: each record carries its writer's clock,
        which may run ahead of this one's); never a call a live replica is running (not asked for `own` calls).
        Under the pvegate-reconcile lock, always: `turn` when the caller holds it, else taken here (held by
        another process: every open call is reported `open`, left for it)."""
        if turn is None:
            async with self.outcomes.audit.exclusive(RECONCILE_LOCK) as mine:
                return await self.run_once(before, since, only, owners, mine, own)
        since = before - LOOKBACK_SECONDS if since is None else since
        audit = self.outcomes.audit
        calls = await asyncio.to_thread(open_calls, audit.path, since, None if owners is not None else before, only)
        if owners is not None:
            calls = [c for c in calls if c.owner in owners]
        if not calls:
            return []
        down: str | None = None  # why the store stopped taking results (or the lock was lost) during this pass
        if not turn:
            down = f"another process holds the {RECONCILE_LOCK} lock (it is reconciling): left to it"
        live = await audit.live_replicas() if not own and down is None else None
        gone: set[str] = set()
        if live is not None:  # PostgreSQL: a replica not seen lately is claimed before its calls are settled
            try:
                gone = await audit.claim_gone(
                    {c.owner for c in calls if c.owner is not None and c.owner not in live}, turn
                )
            except auditlib.TurnLost as exc:
                down = str(exc)
        # the UPIDs other records claim, read from far enough back for every call of this pass, whatever pass it
        # is: settle_own's `since` is this run's start, and a task the previous run started (and recorded)
        # minutes before would otherwise be free to match one of this run's calls whose answer was lost.
        # Bounded: a call decided before the look-back is never searched (settle), so it needs no claims.
        earliest = max(min(c.ts for c in calls), time.time() - LOOKBACK_SECONDS)
        claims_since = min(since, earliest - CLAIM_MARGIN_SECONDS)
        claimed = await asyncio.to_thread(claimed_tasks, audit.path, claims_since)
        out: list[Settled] = []
        for call in calls:
            if down is not None:  # left open for the next pass, and said so: never dropped from a caller's list
                out.append(Settled(call.request_id, call.tool, "open", detail=down, owner=call.owner))
                continue
            if live is not None and call.owner is not None and call.owner not in gone:
                detail = f"replica {call.owner} is alive and runs it"
                out.append(Settled(call.request_id, call.tool, "in_flight", detail=detail, owner=call.owner))
                continue
            if call.request_id in self.outcomes.flights:  # decided under a name this process gave up; it still runs
                detail = "this process still runs it and records its result"
                out.append(Settled(call.request_id, call.tool, "in_flight", detail=detail, owner=call.owner))
                continue
            try:
                settled = await self.settle(call, claimed, before, turn)
            except (AuditUnavailable, auditlib.TurnLost) as exc:  # the store is down, or the lock lost: next pass
                down = str(exc)
                out.append(Settled(call.request_id, call.tool, "open", detail=down, owner=call.owner))
                continue
            except _SettledMeanwhile as exc:
                out.append(Settled(call.request_id, call.tool, "already_settled", detail=str(exc), owner=call.owner))
                continue
            settled.owner = call.owner
            out.append(settled)
            if settled.action == "open" and settled.proxmox == "running":  # still being made: keep it held
                await self._tell(self.outcomes.on_running, call.request_id)
        return out

    async def settle_own(self, since: float) -> list[Settled] | None:
        """Settle this process's own calls left open (`outcomes.unsettled`: interrupted mutations) and
        forget those no longer open; None when another replica is reconciling (PostgreSQL). Under the
        same lock as every other pass: a replica whose name was claimed while the database was away
        must not settle a call another replica settles at the same moment."""
        outcomes = self.outcomes
        mine = set(outcomes.unsettled)
        if not mine:
            return []
        async with outcomes.audit.exclusive(RECONCILE_LOCK) as turn:
            if not turn:
                return None
            settled = await self.run_once(time.time(), since=since, only=mine, turn=turn, own=True)
        # settled ones leave; `in_flight` ones stay: this process still runs them (its answer not yet out of the
        # pipeline: a task that outlived the wait is added before its `running` result), and dropped now their
        # task's end would never be recorded by this process
        outcomes.unsettled -= {s.request_id for s in settled if s.action not in ("open", "in_flight")}
        # ids no longer open (settled elsewhere: another replica, by hand) leave the set too, and their holds
        gone = mine - {s.request_id for s in settled} | {s.request_id for s in settled if s.action == "already_settled"}
        outcomes.unsettled -= gone
        for request_id in gone:
            await self._tell(outcomes.on_settled, request_id)
        return settled

    async def settle_stale_replicas(self) -> list[Settled]:
        """PostgreSQL: settle the calls of replicas that are gone, one replica at a time doing it; forget a
        gone replica once none of its calls is left open (all of them since the look-back, whatever the time
        on its records: a replica whose clock ran ahead is not forgotten with its last calls open)."""
        audit = self.outcomes.audit
        stale = await audit.stale_replicas()
        if not stale:
            return []
        async with audit.exclusive(RECONCILE_LOCK) as mine:
            if not mine:  # another replica is at it
                return []
            settled = await self.run_once(time.time(), owners=stale, turn=mine)
            left = {s.owner for s in settled if s.action in ("open", "in_flight")}
            if mine:  # not after the lock was lost: the replica that took it decides
                await audit.forget_replicas(stale - left)
        return settled

    def _is_read(self, call: OpenCall) -> bool:
        effect = call.effect
        if effect is None and call.tool:  # records written before the effect was recorded
            tool = self.catalog.get(call.tool)
            effect = tool.effect if tool is not None else None
        return effect == "read"

    async def settle(
        self, call: OpenCall, claimed: set[str], before: float | None = None, turn: auditlib.Turn | None = None
    ) -> Settled:
        """Look the call up and write its settling result; with `turn` (the reconcile lock), each write is
        preceded by one statement that checks the lock is still held and the call still open (else
        TurnLost, or _SettledMeanwhile and nothing written)."""
        if self._is_read(call) or call.dry_run:
            what = "a dry run: nothing was sent to Proxmox" if call.dry_run else "a read: nothing changed in Proxmox"
            await self._write(
                call,
                "interrupted",
                {"reconciled": True, "pending_reconcile": False, "finding": what, "task_id": call.task_id},
                turn,
            )
            self.outcomes.counters.reconciled_reads += 1
            return Settled(call.request_id, call.tool, "interrupted", detail=what)
        if call.unreadable is not None:
            # its target or owner may be lost with that body: a task search without them could take another
            # call's task, or a live replica's call, for this one. Final, and it says why (verify tells more).
            why = f"record {call.unreadable} of this call cannot be read (not JSON): run `pvegate audit verify`"
            await self._write(
                call, "reconciled", {"proxmox": "unverifiable", "reason": why, "task_id": call.task_id}, turn
            )
            return Settled(call.request_id, call.tool, "reconciled", "unverifiable", call.task_id, why)
        if call.task_id is not None and UPID_RE.fullmatch(call.task_id) is None:
            # a recorded task id that is no UPID (the gateway records only whole ones: an older release's record,
            # or one changed outside it) names no node to ask: left open, every pass would fail on it again and
            # the call never settle. Final, and it says why; the id is kept, cut, for a person to look it up.
            shown = text.cut(text.visible(call.task_id), 120)
            why = f"its recorded task id {shown!r} is not a Proxmox task id (UPID): its status cannot be asked"
            await self._write(call, "reconciled", {"proxmox": "unverifiable", "reason": why, "task_id": shown}, turn)
            return Settled(call.request_id, call.tool, "reconciled", "unverifiable", shown, why)
        cluster = str(call.target.get("cluster") or self.config.default_cluster)
        client = self.clients.get(cluster)
        if client is None:
            # Nobody here can ask that Proxmox, now or later (this configuration has no URL or token
            # for it): left open, the call would stay open forever and say nothing. What a reader of
            # the audit needs is a final record that says the outcome was not checked and why; the
            # UPID, when there is one, lets a person look the task up on that cluster by hand.
            why = f"cluster {cluster} is not in this configuration: its Proxmox cannot be asked"
            await self._write(
                call,
                "reconciled",
                {
                    "proxmox": "unverifiable",
                    "reason": why,
                    "cluster": cluster,
                    "task_id": call.task_id,
                    "found_by": None,
                    "decided_at": call.ts,
                },
                turn,
            )
            return Settled(call.request_id, call.tool, "reconciled", "unverifiable", call.task_id, why)
        found_by = "upid"
        task_id = call.task_id
        tool = self.catalog.get(call.tool or "")
        types = tool.task_types if tool is not None else ()
        if task_id is None and not types:
            # nothing to search for: a tool answered at once, without a task (any task found would be another
            # call's: never searched), or one this catalog no longer has (its task type is unknown)
            return await self._unverifiable(call, tool is not None, turn)
        # decided before the look-back: Proxmox's task history no longer holds what it started then, so only a
        # recorded UPID Proxmox still answers for says anything; a search, or a UPID it no longer knows, would
        # read as "it did not happen" (not_found) when it cannot be known
        past = time.time() - call.ts > LOOKBACK_SECONDS
        if past and task_id is None:
            return await self._past_lookback(call, turn)
        try:
            if task_id is None:
                found_by = "task_list"
                try:
                    task_id = await self._search(client, cluster, call, types, claimed, before, tool)
                except WorkerIdUnknown as exc:
                    return await self._worker_unknown(call, str(exc), turn)
                if task_id is not None:
                    rivals = await self._rivals(call, cluster, task_id)
                    if rivals:
                        return await self._contested(call, task_id, rivals, turn)
            if task_id is None:
                body: dict[str, Any] = {
                    "proxmox": "not_found",
                    "task_id": None,
                    "found_by": None,
                    "decided_at": call.ts,
                    "note": "no task of this tool's type by the gateway's token for this target around the decision: "
                    "the request did not reach Proxmox, or Proxmox refused it before starting a task",
                }
                await self._write(call, "reconciled", body, turn)
                return Settled(call.request_id, call.tool, "reconciled", "not_found")
            claimed.add(task_id)
            status = await self._status(client, task_id)
        except ToolError as exc:
            return Settled(call.request_id, call.tool, "open", "unreachable", task_id, str(exc))
        if status is None and past:
            return await self._past_lookback(call, turn)
        if status is None:
            await self._write(
                call,
                "reconciled",
                {"proxmox": "not_found", "task_id": task_id, "found_by": found_by, "decided_at": call.ts},
                turn,
            )
            return Settled(call.request_id, call.tool, "reconciled", "not_found", task_id)
        if status.get("status") != "stopped":
            return Settled(call.request_id, call.tool, "open", "running", task_id, "the task is still running")
        exit_status = str(status.get("exitstatus", ""))
        ok = exit_status == "OK" or exit_status.startswith("WARNINGS")
        verdict = "ok" if ok else "failed"
        await self._write(
            call,
            "reconciled",
            {
                "proxmox": verdict,
                "exitstatus": exit_status[:300],
                "task_id": task_id,
                "found_by": found_by,
                "decided_at": call.ts,
            },
            turn,
        )
        return Settled(call.request_id, call.tool, "reconciled", verdict, task_id, exit_status[:300])

    async def _rivals(self, call: OpenCall, cluster: str, upid: str) -> list[OpenCall]:
        """The other calls whose own search could take the task `upid` found for `call`: of the same cluster, a
        tool whose task types hold its type, on its node (or none named), whose worker id is its id (or not
        checked, or unknown), the task's start inside their window, that may have started a task no record
        names (rival_calls). The task list cannot tell such calls' tasks apart (two service restarts, two apt
        refreshes on one node; two deletions of one guest's backups; a previous run's call on the guest whose
        task is not recorded yet): taking the earliest task for the earliest call could give each the other's
        outcome, a failure recorded as a success. Empty: the task is this call's alone."""
        m = UPID_RE.fullmatch(upid)
        if m is None:
            return []
        start = int(m["starttime"], 16)
        # a rival's window holds the start only if it was decided within this much of it (task_window, uncut)
        reach = 2 * self.config.clusters[cluster].timeout + 10 + 2 * CLOCK_SKEW_SECONDS + 1
        found = await asyncio.to_thread(
            rival_calls, self.outcomes.audit.path, float(start - reach), float(start + reach), call.request_id
        )
        out: list[OpenCall] = []
        for other in found:
            tool = self.catalog.get(other.tool or "")
            if tool is None or m["type"] not in tool.task_types or self._is_read(other):
                continue
            if str(other.target.get("cluster") or self.config.default_cluster) != cluster:
                continue
            node = other.target.get("node")
            if node and str(node) != m["node"]:
                continue
            try:
                want = task_worker(other, tool.task_types, tool)[1]
            except WorkerIdUnknown:
                want = None  # its task's id is unknown: it may be this one
            if want is not None and want != m["id"]:
                continue
            since, until = self.task_window(cluster, other.ts, None)
            if since <= start <= until:
                out.append(other)
        return out

    async def _contested(
        self, call: OpenCall, upid: str, rivals: list[OpenCall], turn: auditlib.Turn | None
    ) -> Settled:
        """The task found for a call could as well be another call's (_rivals): never taken for either. A rival
        this process still runs records its UPID soon (then the task is claimed, or not its): left open until
        then. Otherwise final, `unverifiable`, naming the task and the rivals for a person to check; a rival's
        own pass finds this call a rival in turn (it names no task), so neither is settled from the other's."""
        ids = sorted(r.request_id for r in rivals)
        if any(rid in self.outcomes.flights for rid in ids):
            why = f"task {upid} may be that of call(s) {', '.join(ids)}, still in flight"
            return Settled(call.request_id, call.tool, "open", "running", None, why)
        why = (
            f"task {upid}, the one found for it in the task list, could as well be that of call(s) "
            f"{', '.join(ids)} (same type, node and worker id, around the same time, none of them recorded its "
            "task): which call started which task cannot be told, so none is taken; check the target"
        )
        body: dict[str, Any] = {
            "proxmox": "unverifiable",
            "reason": why,
            "task_id": None,
            "found_by": None,
            "candidate": upid,
            "rivals": ids,
            "decided_at": call.ts,
        }
        await self._write(call, "reconciled", body, turn)
        return Settled(call.request_id, call.tool, "reconciled", "unverifiable", None, why)

    async def _worker_unknown(self, call: OpenCall, why: str, turn: auditlib.Turn | None) -> Settled:
        """A mutation without a recorded UPID whose task's worker id its records do not tell: any task of its
        type found could be another call's (a deletion of another volume on the same node), so none is taken.
        Final, and it says why."""
        body: dict[str, Any] = {
            "proxmox": "unverifiable",
            "reason": f"the worker id of its task cannot be told ({why}): a task found could be another "
            "call's, so none is taken; check the target",
            "task_id": None,
            "found_by": None,
            "decided_at": call.ts,
        }
        await self._write(call, "reconciled", body, turn)
        return Settled(call.request_id, call.tool, "reconciled", "unverifiable", None, body["reason"])

    async def _unverifiable(self, call: OpenCall, known: bool, turn: auditlib.Turn | None) -> Settled:
        """A mutation without a recorded UPID whose task cannot be looked for: settled, saying why."""
        if known:  # answered at once, without a task: no task says nothing of whether it was applied
            why = (
                "Proxmox answers this tool at once, without a task: whether the request reached it "
                "and was applied cannot be looked up; check the target"
            )
        else:
            why = f"tool {call.tool} is not in this catalog: the type of the task it would start is unknown"
        body: dict[str, Any] = {
            "proxmox": "unverifiable",
            "reason": why,
            "task_id": None,
            "found_by": None,
            "decided_at": call.ts,
        }
        if known:
            body["synchronous"] = True
        await self._write(call, "reconciled", body, turn)
        return Settled(call.request_id, call.tool, "reconciled", "unverifiable", None, why)

    async def _past_lookback(self, call: OpenCall, turn: auditlib.Turn | None) -> Settled:
        """A mutation decided before the look-back that no task status settles: settled once, saying why (left
        open, it would drop out of every pass, log line and health figure for good)."""
        days = LOOKBACK_SECONDS // 86400
        why = (
            f"decided before the {days}-day look-back ({(time.time() - call.ts) / 86400:.1f} days ago): Proxmox's "
            "task history no longer holds its task, so whether it ran cannot be looked up; check the target"
        )
        body: dict[str, Any] = {
            "proxmox": "unverifiable",
            "reason": why,
            "task_id": call.task_id,
            "found_by": None,
            "decided_at": call.ts,
            "past_lookback": True,
        }
        await self._write(call, "reconciled", body, turn)
        return Settled(call.request_id, call.tool, "reconciled", "unverifiable", call.task_id, why)

    async def _status(self, client: PveApiClient, upid: str) -> dict[str, Any] | None:
        node = upid_node(upid)
        path = f"/nodes/{quote(node, safe='')}/tasks/{quote(upid, safe='')}/status"
        try:
            st = await client.request("GET", path)
        except ToolError as exc:
            if "no such task" in str(exc):
                return None
            raise
        return st if isinstance(st, dict) else None

    async def _search(
        self,
        client: PveApiClient,
        cluster: str,
        call: OpenCall,
        types: tuple[str, ...],
        claimed: set[str],
        before: float | None,
        tool: Tool | None = None,
    ) -> str | None:
        """The gateway's task for this call in the nodes' task lists: the earliest one not claimed by another
        record, of one of the tool's task types, started by the gateway's token itself, with the call's worker
        id, in the call's time window (task_window). The worker id (the UPID's id) is the call's guest's vmid;
        for a tool that declares `task_worker_id` (a task whose id is not the vmid: `103@local` for a prune
        of guest 103's backups), the first of those forms the call's fields fill (worker_id), and then no
        `vmid` filter is sent (Proxmox compares it to the task's id: it would hide the task). Proxmox's filters
        (`typefilter`, exact; `userfilter`, a case-insensitive substring: `root@pam!gw` also returns
        `root@pam!gw-backup`'s tasks; `vmid`) only narrow the list: every candidate's UPID is checked again,
        whole. A call that names no node is looked for on every node the cluster lists; while one of them is
        not online its list cannot be read, and the task may be there: ToolError (the call is left open for a
        later pass), never "not found". WorkerIdUnknown when the call's records do not tell its task's id
        (a volume whose owner they do not say): nothing is searched."""
        vmid, want = task_worker(call, types, tool)
        user = self.token_user(cluster)
        if user is None:
            raise ToolError(f"cannot read the token of cluster {cluster} to search its tasks")
        node = call.target.get("node")
        if node:
            nodes = [str(node)]
        else:
            rows = await client.request("GET", "/nodes") or []
            listed = {
                str(r["node"]): str(r.get("status") or "unknown") for r in rows if isinstance(r, dict) and r.get("node")
            }
            down = [f"{n} ({st})" for n, st in sorted(listed.items()) if st != "online"]
            if down:
                raise ToolError(
                    f"node {', '.join(down)} is not online: its task list, which may hold this call's task, "
                    "cannot be searched (the call is left open until it can)"
                )
            nodes = sorted(listed)
        since, until = self.task_window(cluster, call.ts, before)
        # Proxmox filters a finished task's user with its token id split off (`root@pam`, tokenid `gw`), so
        # `userfilter=root@pam!gw` would find running tasks only: the user part, the token checked in the UPID
        owner = user.partition("!")[0]
        base: dict[str, Any] = {"source": "all", "userfilter": owner, "since": since, "until": until}
        if vmid is not None:
            base["vmid"] = int(vmid)
        candidates: list[tuple[int, str]] = []
        for n in nodes:
            for wtype in types:  # PVE's typefilter takes one type
                params = {**base, "typefilter": wtype, "limit": TASK_LIST_LIMIT}
                rows = await client.request("GET", f"/nodes/{quote(n, safe='')}/tasks", params=params) or []
                for r in rows:
                    upid = r.get("upid") if isinstance(r, dict) else None
                    m = UPID_RE.fullmatch(upid) if isinstance(upid, str) else None
                    if m is None or upid in claimed:
                        continue
                    start = int(m["starttime"], 16)
                    if m["type"] not in types or m["user"] != user or not since <= start <= until:
                        continue
                    if want is not None and m["id"] != want:
                        continue
                    candidates.append((start, str(upid)))
        return min(candidates)[1] if candidates else None

    def task_window(self, cluster: str, decided: float, before: float | None) -> tuple[int, int]:
        """The start times (the node's clock) a call's task may have: from CLOCK_SKEW_SECONDS before its
        decision (the decision's time is the gateway's clock: a gateway ahead of the node would miss the
        task otherwise) to the longest the call could take to be sent (locate + send) plus the same
        tolerance, and, for a call of an earlier run, not past this run's start (`before`) plus it: a task
        started by this run later than that belongs to one of its own calls. A call stamped at or after this
        run's start (the clock stepped back between its run and this one) is not cut by it: the two times
        are not comparable then, and the cut would leave an empty window."""
        window = int(2 * self.config.clusters[cluster].timeout) + 10  # locate + send, at most
        until = int(decided) + window
        if before is not None and int(before) > int(decided):
            until = min(until, int(before) - 1)
        return int(decided) - CLOCK_SKEW_SECONDS, until + CLOCK_SKEW_SECONDS

    async def _write(
        self, call: OpenCall, outcome: str, body: dict[str, Any], turn: auditlib.Turn | None = None
    ) -> None:
        if turn is not None and await turn.confirm(SETTLED_SQL, call.request_id, call.seq):
            raise _SettledMeanwhile("a settling record was written meanwhile (by its replica, or another pass)")
        body["reconciled_at"] = time.time()
        rec = AuditRecord(call.request_id, "result", call.principal, call.tool, call.target_key, outcome, body)
        await self.outcomes.append(rec)
        await self._tell(self.outcomes.on_settled, call.request_id)
        if outcome == "reconciled":
            self.outcomes.counters.reconciled += 1
            if self.outcomes.on_reconciled is not None:
                self.outcomes.on_reconciled(str(body.get("proxmox")))

    @staticmethod
    async def _tell(hook: Callable[[str], Awaitable[None]] | None, request_id: str) -> None:
        """Tell the pool holds a call was settled or is still running (never fails the pass: a hold not
        given back or renewed only lapses sooner or later)."""
        if hook is None:
            return
        try:
            await hook(request_id)
        except Exception as exc:
            log.warning("reconcile: the pool hold of %s not updated (%s)", request_id, type(exc).__name__)


class WorkerIdUnknown(Exception):
    """The worker id of a call's task cannot be told from its records: no task found may be taken as its own."""


def task_worker(call: OpenCall, types: tuple[str, ...], tool: Tool | None) -> tuple[Any, str | None]:
    """(the vmid filter, the worker id) a search for the call's task uses; a worker id of None is not checked
    (a call of no guest, a task whose id is empty or not the call's). WorkerIdUnknown: see volume_worker_id."""
    if VOLUME_TASK in types:  # a volume deletion: its owner and storage, never unchecked
        return None, volume_worker_id(call)
    if tool is not None and tool.task_worker_ids:  # None: no form fits (not checked, as for a call of no guest)
        return None, worker_id(tool.task_worker_ids, tool.target, call)
    vmid = call.target.get("vmid")
    return vmid, None if vmid is None else str(vmid)


def worker_id(forms: tuple[str, ...], params: dict[str, str], call: OpenCall) -> str | None:
    """The worker id a call's task carries, by the tool's `task_worker_id` forms: the first form whose every
    {field} the call has, filled. A field's value is the call's recorded target's, else the argument the
    tool maps that target field to, as recorded (the target leaves `vmid` null for a guest the cluster does
    not list, e.g. a prune of a destroyed guest's backups, while Proxmox names the task by the argument);
    None when no form fits, or when an argument a form needs was given but is not legible in the record
    (redacted): the id is then not checked, as for a call that names no guest."""
    for form in forms:
        values: dict[str, str] = {}
        for name in PLACEHOLDER.findall(form):
            value = call.target.get(name)
            if not _id_part(value) and name in params:
                value = call.arguments.get(params[name])
                if params[name] in call.arguments and not _id_part(value):
                    return None  # given but not legible here (redacted): which form Proxmox used is unknown
            if not _id_part(value):
                break
            values[name] = str(value)
        else:
            return form.format_map(values)  # its only braces are {field} placeholders (catalog.py)
    return None


def volume_worker_id(call: OpenCall) -> str:
    """The worker id of a volume deletion's task (PVE's `imgdel`; pve-storage API2/Storage/Content.pm,
    delete: `<owner vmid>@<storage>`, or `<storage>` for a volume no guest owns), the owner read from the
    call's target.volume_of (the guest the volume's name says owns it). Never left unchecked: another
    deletion's task on the same node has the same type and user, and only this id tells them apart, so a
    record that does not say whose volume it is, or on which storage, is WorkerIdUnknown."""
    owner = _volume_owner_id(call.target.get("volume_of"))
    storage = call.target.get("storage")
    if not _id_part(storage):
        raise WorkerIdUnknown("the call's record does not name the volume's storage")
    return str(storage) if owner is None else f"{owner}@{storage}"


def _volume_owner_id(owner: Any) -> int | None:
    """The vmid of the guest a call's target.volume_of says owns its volume; None when it says nobody does
    (an ISO, a template, a backup whose name has no id). WorkerIdUnknown when it does not say (a guest's
    volume whose name does not tell which guest, no volume_of recorded: an older or edited record)."""
    if not isinstance(owner, dict) or "content" not in owner:
        raise WorkerIdUnknown("the call's record does not say which guest owns the volume: no target.volume_of")
    if owner["content"] is None:
        return None
    vmid = owner.get("vmid")
    if isinstance(vmid, int) and not isinstance(vmid, bool):
        return vmid
    raise WorkerIdUnknown("the volume's name does not say which guest owns it")


def _id_part(value: Any) -> bool:
    """Whether a recorded value can be part of a worker id: an integer (not a bool) or a plain string."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and value != "" and value != REDACTED and not any(c in value for c in ":/ \t\n")


def _pass_failed(what: str, exc: BaseException) -> None:
    """A pass that failed because a store is away (PostgreSQL down, the audit refusing writes) is one line
    each time it is tried, not a traceback every 10 s of an outage; anything else (a bug) with its traceback."""
    if isinstance(exc, (*STORE_ERRORS, AuditUnavailable, OSError)) or db.refusal(exc) is not None:
        log.warning("%s: %s: %s", what, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    else:
        log.exception(what)


class _SettledMeanwhile(Exception):
    """The call got a settling record after this pass read it as open: nothing is written."""


def summary(settled: list[Settled]) -> str:
    counts: dict[str, int] = {}
    for s in settled:
        key = f"{s.action}:{s.proxmox}" if s.proxmox else s.action
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "nothing to reconcile"


def _log_end(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return  # shutdown
    exc = task.exception()
    log.error("the reconciler stopped: calls left open are no longer settled", exc_info=exc)


async def _earlier_pass(reconciler: Reconciler, before: float) -> list[Settled] | None:
    """One pass over what earlier runs left open: the calls read at start-up (Reconciler.read_earlier), by
    id; the first time, with those decided before the look-back added (a scan of the audit's whole past,
    once per start, in the background). None while another replica reconciles."""
    # replicas starting together take turns (PostgreSQL), so no call is settled twice
    async with reconciler.outcomes.audit.exclusive(RECONCILE_LOCK) as turn:
        if not turn:
            return None
        path, lookback = reconciler.outcomes.audit.path, before - LOOKBACK_SECONDS
        if reconciler.earlier is None:  # not read at start-up (that read failed): by time, as nothing else tells
            found = await asyncio.to_thread(open_calls, path, lookback, before)
            reconciler.earlier = {c.request_id for c in found}
        if not reconciler.past_read:
            found = await asyncio.to_thread(open_calls, path, None, lookback)
            reconciler.earlier |= {c.request_id for c in found}
            reconciler.past_read = True
        settled = await reconciler.run_once(before, only=reconciler.earlier, turn=turn)
        reconciler.earlier = {s.request_id for s in settled if s.action == "open"}
    if reconciler.restored:
        await reconciler.forget_restored(settled)
    return settled


async def reconcile_loop(reconciler: Reconciler, before: float, interval: float = 10.0) -> None:
    """At start-up: settle what earlier runs left open (open when this process started at `before`:
    Reconciler.read_earlier, _earlier_pass); retry, with back-off, what is still running or unreachable
    (a node not online, for a call searched on every node). Every `interval`, from the
    start and whatever earlier runs left open: settle the calls this process itself left open
    (`interrupted`: contact with Proxmox lost while waiting), only those, by request id, never a
    call still in flight; on PostgreSQL, the calls of replicas that are gone. (A call decided and
    then refused unsent closes itself with its refusal record: nothing to look up in Proxmox.)"""
    delay = 2.0
    outcomes = reconciler.outcomes
    earlier_due: float | None = time.monotonic()  # None once nothing decided before `before` is open
    periodic_due = time.monotonic() + interval
    # each pass's last failure, kept until that same pass succeeds: a pass that keeps failing is never
    # hidden by another one succeeding (the heartbeat health and metrics show moves only when none fails)
    errors: dict[str, str] = {}
    while True:
        if earlier_due is not None and time.monotonic() >= earlier_due:
            try:
                settled = await _earlier_pass(reconciler, before)
                errors.pop("earlier", None)
            except Exception as exc:  # never take the gateway down; say so and try again
                _pass_failed("reconciliation pass failed", exc)
                errors["earlier"] = f"reconciliation pass failed: {type(exc).__name__}"
                settled = [Settled("", None, "open")]
                reconciler.earlier_open = None  # unknown, not zero
            if settled is None:  # another replica is reconciling: after it, this one looks again
                earlier_due = time.monotonic() + delay
            else:
                if settled and "earlier" not in errors:
                    log.warning("reconciliation: %s", summary(settled))
                    reconciler.earlier_open = sum(s.action == "open" for s in settled)
                if any(s.action == "open" for s in settled):
                    earlier_due = time.monotonic() + delay
                    delay = min(delay * 2, 60.0)
                else:
                    reconciler.earlier_open, reconciler.earlier_done, earlier_due = 0, True, None
        if time.monotonic() >= periodic_due:
            if outcomes.audit.pg:  # replicas that are gone: their calls in flight are for the living to settle
                try:
                    stale = await reconciler.settle_stale_replicas()
                    reconciler.stale_open = sum(s.action == "open" for s in stale)
                    errors.pop("stale", None)
                except Exception as exc:
                    _pass_failed("reconciliation of stale replicas failed", exc)
                    errors["stale"] = f"reconciliation of stale replicas failed: {type(exc).__name__}"
                    stale = []
                if stale:
                    log.warning("reconciliation of stale replicas: %s", summary(stale))
            try:
                own = await reconciler.settle_own(before)
                errors.pop("own", None)
            except Exception as exc:
                _pass_failed("reconciliation pass failed", exc)
                errors["own"] = f"reconciliation of this process's own calls failed: {type(exc).__name__}"
                own = None
            if own:
                log.warning("reconciliation: %s", summary(own))
            periodic_due = time.monotonic() + interval
        reconciler.last_error = "; ".join(errors.values()) or None
        if not errors:
            reconciler.last_pass_at = time.time()
        wake = periodic_due if earlier_due is None else min(periodic_due, earlier_due)
        await asyncio.sleep(max(0.0, wake - time.monotonic()))
