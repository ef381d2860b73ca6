"""Prometheus metrics an SRE alerts on, served at /metrics (and /admin/metrics).

prometheus_client does the text format and the histograms. Each gateway has its
own registry (tests run several gateways in one process). The hot path touches
only pre-bound children: one histogram observation is ~1 µs, a counter ~0.25 µs,
~5 µs per call in all (docs/deployment.md has the measurement). Numbers the
gateway already keeps for itself (audit commits, OPA restarts, approvals) are
read at scrape time by a collector, so they cost the hot path nothing.

No label carries a principal or an argument: cardinality stays bounded (phases,
outcomes, clusters, connector kinds), and a scrape reveals no identities.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.store.db import DatabaseUnavailable
from gateway.tools.runtimes.base import UpstreamError

if TYPE_CHECKING:
    from gateway.components import Components

log = logging.getLogger("pvegate.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# how long a scrape (or /admin/health) waits on the approvals database: well inside Prometheus'
# default scrape timeout (10 s), so a database that hangs costs one series, never the scrape
APPROVALS_TIMEOUT_SECONDS = 2.0
APPROVAL_STATES = ("pending", "approved", "denied", "withdrawn", "expired", "used")

# no `*_created` series next to every counter and histogram: they double the exposition, and the
# classic text format's consumers (Prometheus alert rules) do not use them
disable_created_metrics()  # type: ignore[no-untyped-call]

PHASES = ("authenticate", "decide", "dispatch", "audit")
# 0.5 ms .. 30 s: a decision takes ~1 ms, an audit group commit a few ms, a Proxmox call up to its timeout
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# decisions by outcome: a failed-closed denial (no usable answer from OPA) is not a policy denial
DECISION_OUTCOMES = ("allow", "deny", "pending", "failed_closed")
# every outcome of pvegate_call_seconds (mcp/methods.py _run): a tools/call's CallResult.outcome, plus the
# three that end it with an RPC error (unknown_tool, audit_unavailable, error)
CALL_OUTCOMES = (
    "allowed",
    "denied",
    "pending_approval",
    "invalid",
    "failed",
    "interrupted",
    "unknown_tool",
    "audit_unavailable",
    "error",
)
# why a principal's request was refused at its door (store/principal_limits.py)
PRINCIPAL_LIMITED_REASONS = ("inflight", "refusal_budget")
# upstream kinds by connector: composite tools say so, as their inner step is not known here
UPSTREAM_KIND = {"pve_api": "api", "ssh": "ssh", "composite": "composite"}
# every reason of pvegate_upstream_errors_total (upstream_reason): UpstreamError's causes, then timeout, error
UPSTREAM_REASONS = ("unreachable", "tls", "host_key", "auth", "circuit_open", "busy", "timeout", "error")


def upstream_reason(exc: BaseException) -> str:
    """Why a connector call failed: an UpstreamError's cause (unreachable, tls, host_key, auth, circuit_open, busy),
    'timeout' when a timeout is anywhere in the cause chain, else 'error' (Proxmox answered an
    error, a task or command failed, a guest was not where the call said)."""
    if isinstance(exc, UpstreamError):
        return exc.cause
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, TimeoutError | httpx.TimeoutException):
            return "timeout"
        seen = seen.__cause__ or seen.__context__
    return "error"


class Metrics:
    """The gateway's metrics; one instance per Components."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.phase_seconds = Histogram(
            "pvegate_phase_seconds",
            "Time spent in each phase of a request (authenticate, decide, dispatch, audit).",
            ["phase"],
            buckets=BUCKETS,
            registry=r,
        )
        self.phase = {p: self.phase_seconds.labels(p) for p in PHASES}
        self.call_seconds = Histogram(
            "pvegate_call_seconds", "Whole tools/call latency, by outcome.", ["outcome"], buckets=BUCKETS, registry=r
        )
        self.call_outcome = {o: self.call_seconds.labels(o) for o in CALL_OUTCOMES}
        self.decisions_total = Counter(
            "pvegate_decisions_total",
            "tools/call decisions by outcome; failed_closed counts denials because OPA gave no usable answer.",
            ["outcome"],
            registry=r,
        )
        self.decision = {o: self.decisions_total.labels(o) for o in DECISION_OUTCOMES}
        self.upstream_errors_total = Counter(
            "pvegate_upstream_errors_total",
            "Failed connector calls after an allow, by cluster, kind (api, ssh, composite) and reason "
            f"({', '.join(UPSTREAM_REASONS)}).",
            ["cluster", "kind", "reason"],
            registry=r,
        )
        self.calls_in_flight = Gauge("pvegate_calls_in_flight", "tools/call requests being handled.", registry=r)
        self.principal_limited_total = Counter(
            "pvegate_principal_limited_total",
            "MCP requests of an authenticated principal refused at its door, by reason: inflight (it had "
            "max_inflight_per_principal calls in flight), refusal_budget (refused_calls_per_minute_per_principal "
            "of its calls were refused in the last minute; its protocol faults in that time are counted here "
            "too). Counted, not audited one by one: one summary row per principal and minute.",
            ["reason"],
            registry=r,
        )
        self.principal_limited_reason = {
            reason: self.principal_limited_total.labels(reason) for reason in PRINCIPAL_LIMITED_REASONS
        }
        # Incremented by the outcomes work (dispatch records): a call whose result was never recorded
        # (the gateway stopped mid-call) is `interrupted`; asking Proxmox what became of it afterwards
        # is `reconciled`, labelled with what was found.
        self.calls_interrupted_total = Counter(
            "pvegate_calls_interrupted_total",
            "Calls sent to Proxmox whose result was never recorded (gateway stopped or crashed mid-call).",
            registry=r,
        )
        self.calls_reconciled_total = Counter(
            "pvegate_calls_reconciled_total",
            "Interrupted calls whose outcome was later established with Proxmox, by what was found.",
            ["result"],
            registry=r,
        )
        self.cluster_probes_total = Counter(
            "pvegate_cluster_probes_total",
            "Background reachability probes of each cluster's API, by state (ok, unreachable, unauthorized, error).",
            ["cluster", "state"],
            registry=r,
        )
        self.opa_probe_seconds = Histogram(
            "pvegate_opa_probe_seconds", "Latency of the readiness probe's decision query.", buckets=BUCKETS, registry=r
        )
        self.opa_probe_failures_total = Counter(
            "pvegate_opa_probe_failures_total",
            "Readiness probes of OPA that got no decision inside the contract in time.",
            registry=r,
        )
        # the approvals count being read (approval_counts): one at a time, however many scrapes wait
        self._counting: asyncio.Task[dict[str, int]] | None = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def attach(self, components: Components) -> None:
        """Expose the numbers the components keep themselves, read at scrape time."""
        self.registry.register(_ComponentCollector(components))

    # --- helpers for the hot path ----------------------------------------------------

    def observe(self, phase: str, started: float) -> float:
        """Record the phase that began at `started` (perf_counter); returns now."""
        now = time.perf_counter()
        self.phase[phase].observe(now - started)
        return now

    def call_done(self, outcome: str, seconds: float) -> None:
        child = self.call_outcome.get(outcome)
        (child or self.call_seconds.labels(outcome)).observe(seconds)

    def principal_limited(self, reason: str) -> None:
        child = self.principal_limited_reason.get(reason)
        (child or self.principal_limited_total.labels(reason)).inc()

    def upstream_error(self, cluster: str, connector: str, exc: BaseException) -> None:
        self.upstream_errors_total.labels(cluster, UPSTREAM_KIND.get(connector, connector), upstream_reason(exc)).inc()

    # --- for the outcomes work (dispatch records and reconciliation) ------------------

    def interrupted(self, n: int = 1) -> None:
        self.calls_interrupted_total.inc(n)

    def reconciled(self, result: str) -> None:
        """`result`: what Proxmox says became of the call (e.g. ok, failed, unknown)."""
        self.calls_reconciled_total.labels(result).inc()


class _ComponentCollector(Collector):
    """Scrape-time view of counters the audit log, the OPA sidecar, the approvals and health keep."""

    def __init__(self, c: Components) -> None:
        self.c = c

    def collect(self) -> Iterator[Metric]:
        c = self.c
        records = CounterMetricFamily(
            "pvegate_audit_records",
            "Audit records written by this process, by kind and outcome.",
            labels=["kind", "outcome"],
        )
        for (kind, outcome), n in sorted(c.audit.counts.items()):
            records.add_metric([kind, outcome], n)
        yield records
        yield CounterMetricFamily(
            "pvegate_audit_commits", "Audit transactions (group commits) by this process.", value=c.audit.commits
        )
        failures = CounterMetricFamily(
            "pvegate_unauthenticated_refusals",
            "Requests refused without an identity, by surface: mcp, admin, metrics (a missing or bad credential: "
            "auth_failure rows), transport (refused by the transport guard before authentication: refusal rows), "
            "console (a refused console sign-in: console rows); and how they were recorded: row (an audit row of "
            "its own) or suppressed (beyond the per-address bound: counted, and summed up in one row of the same "
            "kind with outcome suppressed).",
            labels=["surface", "recorded"],
        )
        for (surface, recorded), n in sorted(c.auth_failures.counts.items()):
            failures.add_metric([surface, recorded], n)
        yield failures
        yield CounterMetricFamily(
            "pvegate_audit_write_failures",
            "Audit transactions that failed (records not written; the calls waiting on them fail closed).",
            value=c.audit.write_failures,
        )
        yield CounterMetricFamily(
            "pvegate_audit_leases_lost",
            "Times this replica found its heartbeat in the shared audit stale (paused or cut off from PostgreSQL "
            "past 20 s): it went on under a new name and sent none of the mutations decided under the old one.",
            value=c.audit.leases_lost,
        )
        sidecar = c.sidecar
        if sidecar is not None:
            opa_up = sidecar.alive()
        else:  # an external OPA: the readiness probe's view of it (the `opa` check of /readyz), never a constant
            opa_up = c.health is not None and c.health.checks()["opa"]["ok"]
        yield GaugeMetricFamily(
            "pvegate_opa_up",
            "Whether OPA is up: the managed OPA process runs; for an external OPA, the readiness probe got a "
            "decision inside the contract recently (the `opa` check of /readyz).",
            value=int(opa_up),
        )
        yield CounterMetricFamily(
            "pvegate_opa_restarts", "Restarts of the managed OPA sidecar.", value=sidecar.restarts if sidecar else 0
        )
        yield GaugeMetricFamily(
            "pvegate_python_gc_frozen_objects",
            "Objects `pvegate serve` moved out of the cyclic collector's sight after start-up (gc.freeze); "
            "0 means every full collection walks the whole heap and pauses the event loop for it.",
            value=gc.get_freeze_count(),
        )
        if c.health is not None:
            yield from c.health.collect()


def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    g.add_metric(list((labels or {}).values()), value)
    return g


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a failure nobody waited for any more is not logged as never retrieved


async def approval_counts(
    c: Components, within: float = APPROVALS_TIMEOUT_SECONDS
) -> tuple[dict[str, int] | None, str | None]:
    """Approval requests by state (one COUNT query), or None and why the store gave no answer within
    `within` seconds. A query that outlives its caller is not cancelled (the database's own timeout
    ends it) but shared: the next caller waits on it rather than stacking another on a stuck server."""
    store = c.approvals.store
    if store is None:
        return {}, None
    task = c.metrics._counting
    if task is None or task.done():
        task = c.metrics._counting = asyncio.ensure_future(store.state_counts())
        task.add_done_callback(_retrieved)
    done, _ = await asyncio.wait({task}, timeout=within)
    if not done:
        return None, f"the approvals database did not answer within {within:g} s"
    if task.cancelled():
        return None, "the approvals count was cancelled"
    exc = task.exception()
    if exc is not None:
        # DatabaseUnavailable says what is wrong in its own words; anything else by its type only
        why = str(exc) if isinstance(exc, DatabaseUnavailable) else type(exc).__name__
        log.warning("approvals state counts unavailable: %s", why)
        return None, f"the approvals database refused the count ({why})"
    return task.result(), None


async def approvals_gauge(c: Components) -> list[str]:
    """Approval requests by state, as exposition lines (read from the store: async, so not in the
    collector), and whether they could be read: a database that is down or slow never fails the scrape."""
    if c.approvals.store is None:
        return []
    counts, _ = await approval_counts(c)
    lines = [
        "# HELP pvegate_approvals_state_unavailable 1 when this scrape could not read the approval counts "
        "(the approvals database is down or slow): pvegate_approvals is absent then.",
        "# TYPE pvegate_approvals_state_unavailable gauge",
        f"pvegate_approvals_state_unavailable {int(counts is None)}",
    ]
    if counts is None:
        return lines
    lines += ["# HELP pvegate_approvals Approval requests by state.", "# TYPE pvegate_approvals gauge"]
    for state in APPROVAL_STATES:
        lines.append(f'pvegate_approvals{{state="{state}"}} {counts.get(state, 0)}')
    return lines


async def exposition(c: Components) -> bytes:
    text = c.metrics.render()  # on the loop: the collector reads dicts the loop mutates (~0.2 ms)
    extra = await approvals_gauge(c)
    if c.policy_status is not None:  # the bundle status OPA reports (gateway/policy/bundle_status.py)
        extra = c.policy_status.prometheus() + extra
    return text + ("\n".join(extra) + "\n").encode() if extra else text
