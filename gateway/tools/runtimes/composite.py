"""The composite runtime: a named reducer over other read-only tools' results.

Each sub-call is validated against its tool's parameters and dispatched through
that tool's own runtime (pve_api or ssh), so the SSH allow-list, TLS pinning and
argument checks all still apply. Only tools declared in `uses:` are reachable,
and the loader guarantees they are read-only leaf tools.

A composite call has one overall deadline, DEADLINE_FACTOR times the longer of the
cluster's Proxmox `timeout` and `ssh.command_timeout`: each sub-call is bounded, but
their number follows what Proxmox and the guests answer. Past it the sub-calls still
running are cancelled and the call fails.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.core.config import ClusterConfig, SSHConfig
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, Runtime, ToolError, ToolOutput
from gateway.tools.runtimes.reducers import COMPOSITES
from gateway.tools.tool import ArgumentError, Tool

log = logging.getLogger("pvegate.composite")
# room for a Proxmox read at its own deadline (4x `timeout`, retries included) and then an SSH connect and
# command or two; far short of the hours a guest's thousand-row `docker ps` could otherwise make one call run
DEADLINE_FACTOR = 6


class CompositeRuntime:
    def __init__(
        self, catalog: Catalog, runtimes: dict[str, Runtime], clusters: dict[str, ClusterConfig] | None = None
    ) -> None:
        self.catalog = catalog
        self.runtimes = runtimes  # the leaf runtimes; composites never nest
        self.clusters = clusters or {}  # each cluster's Proxmox and SSH timeouts: its calls' deadline

    def deadline(self, cluster: str) -> float:
        """Seconds a composite call on this cluster may take in all."""
        cl = self.clusters.get(cluster)
        if cl is None:  # runtimes built without the config (tests): the config's defaults
            return DEADLINE_FACTOR * max(ClusterConfig.timeout, SSHConfig.command_timeout)
        return DEADLINE_FACTOR * max(cl.timeout, cl.ssh.command_timeout if cl.ssh else 0.0)

    def check(self, tool: Tool, arguments: dict[str, Any]) -> None:
        return None  # a composite's leaf calls are checked by their own runtime when they run

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput:
        warnings: list[str] = []
        uses = set(tool.spec["uses"])

        async def sub(name: str, args: dict[str, Any]) -> Any:
            leaf = self.catalog.get(name)
            if name not in uses or leaf is None or leaf.effect != "read" or leaf.connector == "composite":
                raise ToolError(f"{tool.name} may not call {name}")
            try:
                validated = leaf.validate({**args, "cluster": ctx.cluster})
            except ArgumentError as exc:
                raise ToolError(f"{name}: {exc}") from exc
            on_dispatch = None
            if ctx.on_dispatch is not None:
                parent = ctx.on_dispatch

                async def on_dispatch(info: dict[str, Any]) -> None:
                    # each command a sub-call starts on a node is in the audit, as a direct call's is
                    await parent({**info, "via": name})

            sub_ctx = CallContext(
                cluster=ctx.cluster, dry_run=False, request_id=ctx.request_id, on_dispatch=on_dispatch
            )
            out = await self.runtimes[leaf.connector].call(leaf, validated, sub_ctx)
            warnings.extend(f"{name}: {w}" for w in out.warnings)
            return out.data

        bound = self.deadline(ctx.cluster)
        timer = asyncio.timeout(bound)
        try:
            async with timer:  # cancels the sub-calls still running (their sessions freed as a cancelled call's)
                data = await COMPOSITES[tool.spec["reducer"]](sub, arguments, warnings)
        except ToolError:
            raise
        except Exception as exc:
            if timer.expired():  # the deadline's TimeoutError
                raise ToolError(
                    f"{tool.name} did not finish within its {bound:g}s deadline ({DEADLINE_FACTOR} times the longer of "
                    "the cluster's timeout and ssh.command_timeout); the sub-calls still running were cancelled"
                ) from exc
            # an unexpected answer shape: a clear tool error, never a 500
            log.exception("composite %s failed", tool.name)
            raise ToolError(f"{tool.name} could not combine the results ({type(exc).__name__})") from exc
        return ToolOutput(data=data, warnings=list(dict.fromkeys(warnings)))

    async def close(self) -> None:
        return None
