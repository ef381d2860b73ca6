"""The composite runtime: a named reducer over other read-only tools' results.

Each sub-call is validated against its tool's parameters and dispatched through
that tool's own runtime (pve_api or ssh), so the SSH allow-list, TLS pinning and
argument checks all still apply. Only tools declared in `uses:` are reachable,
and the loader guarantees they are read-only leaf tools.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, Runtime, ToolError, ToolOutput
from gateway.tools.runtimes.reducers import COMPOSITES
from gateway.tools.tool import ArgumentError, Tool

log = logging.getLogger("pvegate.composite")


class CompositeRuntime:
    def __init__(self, catalog: Catalog, runtimes: dict[str, Runtime]) -> None:
        self.catalog = catalog
        self.runtimes = runtimes  # the leaf runtimes; composites never nest

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

        try:
            data = await COMPOSITES[tool.spec["reducer"]](sub, arguments, warnings)
        except ToolError:
            raise
        except Exception as exc:  # an unexpected answer shape: a clear tool error, never a 500
            log.exception("composite %s failed", tool.name)
            raise ToolError(f"{tool.name} could not combine the results ({type(exc).__name__})") from exc
        return ToolOutput(data=data, warnings=list(dict.fromkeys(warnings)))

    async def close(self) -> None:
        return None
