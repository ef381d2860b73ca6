"""Everything a call needs, built once at start-up and shared by all requests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.core.config import Config
from gateway.observability.health import HealthMonitor
from gateway.observability.metrics import Metrics
from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.decisions import DecisionClient
from gateway.policy.listings import ListingCache
from gateway.policy.opa_sidecar import OPASidecar
from gateway.store.approvals import Approvals
from gateway.store.audit import AuditLog
from gateway.store.auth_failures import AuthFailures
from gateway.store.holds import MemoryHolds, PoolHolds
from gateway.store.outcomes import Outcomes
from gateway.store.principal_limits import DoorRefusals, PrincipalLimits
from gateway.store.usage import MemoryQuotas, Quotas
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import Runtime
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.targets import TargetResolver
from gateway.tools.tool import ArgumentError, Tool


@dataclass
class Components:
    config: Config
    catalog: Catalog
    audit: AuditLog
    decisions: DecisionClient
    targets: TargetResolver
    approvals: Approvals
    runtimes: dict[str, Runtime]
    usage: Quotas = field(default_factory=MemoryQuotas)
    holds: PoolHolds = field(default_factory=MemoryHolds)  # allocating calls in flight, per pool
    listings: ListingCache = field(default_factory=lambda: ListingCache(ttl=0))
    sidecar: OPASidecar | None = None
    # the active policy revision and the last bundle error, refreshed from OPA (readiness, admin API)
    policy_status: PolicyStatus | None = None
    metrics: Metrics = field(default_factory=Metrics)
    health: HealthMonitor | None = None  # built with the components; probes run while serving
    clients: dict[str, PveApiClient] = field(default_factory=dict)  # one Proxmox API client per cluster
    outcomes: Outcomes = field(init=False)  # store checks, calls in flight, drain, outbox
    # auth_failure rows and pre-auth refusals (transport guard, console sign-in), bounded per client address
    auth_failures: AuthFailures = field(init=False)
    # calls in flight and refused calls per principal, and the summaries of calls refused at its door
    principal_limits: PrincipalLimits = field(init=False)

    def __post_init__(self) -> None:
        grace = self.config.shutdown_grace_seconds
        self.outcomes = Outcomes(
            self.audit,
            grace_seconds=default_grace(self.catalog) if grace is None else grace,
            min_free_bytes=int(self.config.audit_min_free_mb * 1024 * 1024),
        )
        self.outcomes.on_reconciled = self.metrics.reconciled  # pvegate_calls_reconciled_total{result}
        self.outcomes.on_settled = self.holds.give_back_call  # what it made is listed by now (or nothing was)
        self.outcomes.on_running = self.holds.renew_call  # still being made: held while it is
        if self.health is not None:  # readiness is red while calls are refused for the audit store
            self.health.outcomes = self.outcomes
        self.auth_failures = AuthFailures(self.audit, per_source=self.config.audit_auth_failure_rows_per_minute)
        self.principal_limits = PrincipalLimits(
            max_inflight=self.config.max_inflight_per_principal,
            refusals_per_window=self.config.refused_calls_per_minute_per_principal,
            summaries=DoorRefusals(self.audit),
            on_limited=self.metrics.principal_limited,  # pvegate_principal_limited_total{reason}
        )

    def runtime(self, tool: Tool) -> Runtime:
        return self.runtimes[tool.connector]

    def cluster_for(self, tool: Tool, args: dict[str, Any]) -> str:
        name = args.get(tool.target.get("cluster", "cluster")) or self.config.default_cluster
        if name not in self.config.clusters:
            raise ArgumentError(f"unknown cluster {name!r}; configured: {', '.join(self.config.clusters)}")
        return str(name)

    @staticmethod
    def render(tool: Tool, structured: dict[str, Any]) -> str:
        """The text rendering of a structured result, for clients that show only text: compact JSON,
        which the json module's C encoder writes (an indented one goes through its Python encoder: 3x
        slower, and more tokens for an agent to read)."""
        return json.dumps(structured, separators=(",", ":"), default=str)

    async def close(self) -> None:
        await self.outcomes.stop()  # kept records: one last try before the audit closes
        await self.auth_failures.close()  # the counted auth failures' summaries (never raises)
        await self.principal_limits.summaries.close()  # and those of calls refused at a principal's door
        if self.health is not None:
            await self.health.stop()
        for rt in self.runtimes.values():
            await rt.close()
        await self.approvals.close()
        await self.usage.close()
        await self.holds.close()
        await self.decisions.close()
        await self.audit.close()
        if self.sidecar is not None:
            self.sidecar.stop()


GRACE_MARGIN_SECONDS = 15.0


def default_grace(catalog: Catalog) -> float:
    """Long enough for the longest task any tool waits on, plus a margin for the last records."""
    waits = [float(t.spec.get("task_timeout", 60)) for t in catalog if t.spec.get("task") == "wait"]
    return max(waits, default=60.0) + GRACE_MARGIN_SECONDS
