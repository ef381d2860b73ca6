"""Everything a call needs, built once at start-up and shared by all requests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.approvals import Approvals
from gateway.audit import AuditLog
from gateway.catalog import Catalog
from gateway.config import Config
from gateway.connectors import Runtime
from gateway.decisions import DecisionClient
from gateway.listings import ListingCache
from gateway.opa_sidecar import OPASidecar
from gateway.targets import TargetResolver
from gateway.tool import ArgumentError, Tool
from gateway.usage import UsageCounters


@dataclass
class Components:
    config: Config
    catalog: Catalog
    audit: AuditLog
    decisions: DecisionClient
    targets: TargetResolver
    approvals: Approvals
    runtimes: dict[str, Runtime]
    usage: UsageCounters = field(default_factory=UsageCounters)
    listings: ListingCache = field(default_factory=lambda: ListingCache(ttl=0))
    sidecar: OPASidecar | None = None

    def runtime(self, tool: Tool) -> Runtime:
        return self.runtimes[tool.connector]

    def cluster_for(self, tool: Tool, args: dict[str, Any]) -> str:
        name = args.get(tool.target.get("cluster", "cluster")) or self.config.default_cluster
        if name not in self.config.clusters:
            raise ArgumentError(f"unknown cluster {name!r}; configured: {', '.join(self.config.clusters)}")
        return str(name)

    @staticmethod
    def render(tool: Tool, structured: dict[str, Any]) -> str:
        """The text rendering of a structured result, for clients that show only text."""
        return json.dumps(structured, indent=1, sort_keys=False, default=str)

    async def close(self) -> None:
        for rt in self.runtimes.values():
            await rt.close()
        await self.approvals.close()
        await self.decisions.close()
        await self.audit.close()
        if self.sidecar is not None:
            self.sidecar.stop()
