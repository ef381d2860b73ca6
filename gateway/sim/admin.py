"""Simulator-only admin API on loopback HTTP: logs, faults, state peek. Never part of PVE."""

from __future__ import annotations

import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.sim.runtime import Runtime


def admin_app(rt: Runtime) -> Starlette:
    async def requests(_: Request) -> JSONResponse:
        return JSONResponse(list(rt.requests))

    async def ssh(_: Request) -> JSONResponse:
        return JSONResponse(list(rt.ssh))

    async def clear(_: Request) -> JSONResponse:
        rt.requests.clear()
        rt.ssh.clear()
        return JSONResponse({"ok": True})

    async def faults(request: Request) -> JSONResponse:
        if request.method == "POST":
            body: dict[str, Any] = await request.json()
            try:
                rt.faults.update(body)
            except (ValueError, TypeError) as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            rt.cluster.touch()
        return JSONResponse(rt.faults.as_dict())

    async def state(_: Request) -> JSONResponse:
        cl = rt.cluster
        return JSONResponse(
            {
                "cluster": cl.name,
                "version": cl.version,
                "uptime": time.time() - rt.started,
                "nodes": {n.name: {"online": rt.node_online(n.name)} for n in cl.nodes.values()},
                "guests": {
                    str(g.vmid): {
                        "type": g.type,
                        "node": g.node,
                        "name": g.name,
                        "status": g.status,
                        "lock": g.lock,
                        "pool": g.pool,
                        "tags": g.tags,
                        "snapshots": [s.name for s in g.snapshots],
                        "config": g.config,
                        "docker": None
                        if g.docker is None
                        else [
                            {"id": c.id, "name": c.name, "image": c.image, "state": c.state, "env": c.env}
                            for c in g.docker
                        ],
                    }
                    for g in cl.guests.values()
                },
                "tasks": [
                    {"upid": t.upid, "type": t.type, "id": t.id, "status": t.status, "exitstatus": t.exitstatus}
                    for t in cl.tasks.values()
                ],
                "volumes": [v.volid for v in cl.volumes],
                "faults": rt.faults.as_dict(),
            }
        )

    return Starlette(
        routes=[
            Route("/_sim/requests", requests, methods=["GET"]),
            Route("/_sim/ssh", ssh, methods=["GET"]),
            Route("/_sim/clear", clear, methods=["POST"]),
            Route("/_sim/faults", faults, methods=["GET", "POST"]),
            Route("/_sim/state", state, methods=["GET"]),
        ]
    )
