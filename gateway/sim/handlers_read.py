"""Read-only (GET) endpoints. List endpoints filter by ACL the way PVE does."""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.sim import views
from gateway.sim.routes import Ctx, RawBody, route


@route("GET", "/version")
def get_version(ctx: Ctx) -> Any:
    return views.version(ctx.rt.cluster)


@route("GET", "/cluster/status")
def get_cluster_status(ctx: Ctx) -> Any:
    return views.cluster_status(ctx.rt.cluster, ctx.rt.faults.offline_nodes)


def visible_resource(ctx: Ctx, r: dict[str, Any]) -> dict[str, Any] | None:
    t = r["type"]
    if t in ("qemu", "lxc"):
        return r if ctx.can(f"/vms/{r['vmid']}", "VM.Audit") else None
    if t == "node":
        if ctx.can(f"/nodes/{r['node']}", "Sys.Audit"):
            return r
        return {k: r[k] for k in ("id", "type", "node", "status")}
    if t == "storage":
        return r if ctx.can(f"/storage/{r['storage']}", "Datastore.Audit", "Datastore.AllocateSpace") else None
    if t == "pool":
        return r if ctx.can(f"/pool/{r['pool']}", "Pool.Audit") else None
    if t == "sdn":
        return r if ctx.can(f"/sdn/zones/{r['sdn']}", "SDN.Audit") else None
    return r


_resource_cache: dict[tuple[str, str | None, int, int, tuple[str, ...]], bytes] = {}


@route("GET", "/cluster/resources")
def get_cluster_resources(ctx: Ctx) -> Any:
    rt = ctx.rt
    now = time.time()
    rtype = ctx.params.get("type")
    # uptime moves once a second, everything else only on mutation: cache per (token, type, state, second)
    key = (ctx.user, rtype, rt.cluster.version_counter, int(now), tuple(rt.faults.offline_nodes))
    hit = _resource_cache.get(key)
    if hit is None:
        if len(_resource_cache) > 256:
            _resource_cache.clear()
        items = views.cluster_resources(rt.cluster, now, rtype, rt.faults.offline_nodes)
        data = [v for v in (visible_resource(ctx, r) for r in items) if v is not None]
        hit = json.dumps({"data": data}, separators=(",", ":")).encode()
        _resource_cache[key] = hit
    return RawBody(hit)


@route("GET", "/nodes")
def get_nodes(ctx: Ctx) -> Any:
    out = []
    for r in views.nodes(ctx.rt.cluster, time.time(), ctx.rt.faults.offline_nodes):
        if ctx.can(f"/nodes/{r['node']}", "Sys.Audit"):
            out.append(r)
        else:
            out.append({k: r[k] for k in ("id", "type", "node", "status")})
    return out
