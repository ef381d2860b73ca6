"""Render cluster state into PVE response shapes (as PVE's API serves them).

Pure functions of (cluster, now): the API wraps them in `{"data": ...}` and
`pvesh get --output-format json` prints them bare.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.sim.state import Cluster, Guest, Node, Storage


def version(cl: Cluster) -> dict[str, Any]:
    return {"version": cl.version, "release": cl.release, "repoid": cl.repoid}


def is_online(n: Node, forced_offline: list[str]) -> bool:
    return n.online and n.name not in forced_offline


def node_entry(n: Node, now: float, online: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": f"node/{n.name}",
        "type": "node",
        "node": n.name,
        "status": "online" if online else "offline",
        "level": n.level,
    }
    if online:
        d.update(
            uptime=int(now - n.boot_time),
            cpu=n.cpu_load,
            maxcpu=n.maxcpu,
            mem=n.mem,
            maxmem=n.maxmem,
            disk=n.disk,
            maxdisk=n.maxdisk,
        )
    return d


def nodes(cl: Cluster, now: float, off: list[str]) -> list[dict[str, Any]]:
    out = []
    for n in cl.nodes.values():
        d = node_entry(n, now, is_online(n, off))
        d["ssl_fingerprint"] = n.ssl_fingerprint
        out.append(d)
    return out


def guest_stats(g: Guest, now: float) -> dict[str, Any]:
    running = g.status != "stopped"
    return {
        "uptime": g.uptime(now),
        "cpu": g.cpu_load if running else 0,
        "maxcpu": g.cpus,
        "mem": g.mem(),
        "maxmem": g.maxmem,
        "disk": g.disk_used if running else 0,
        "maxdisk": g.maxdisk,
        "netin": g.netin if running else 0,
        "netout": g.netout if running else 0,
        "diskread": g.vmid * 65536 if running else 0,
        "diskwrite": g.vmid * 16384 if running else 0,
    }


def guest_resource(cl: Cluster, g: Guest, now: float, off: list[str]) -> dict[str, Any]:
    node = cl.nodes[g.node]
    d: dict[str, Any] = {
        "id": f"{g.type}/{g.vmid}",
        "type": g.type,
        "vmid": g.vmid,
        "node": g.node,
        "name": g.name,
        "template": 1 if g.template else 0,
    }
    if not is_online(node, off):
        d["status"] = "unknown"  # no RRD data from an offline node
    else:
        d["status"] = "running" if g.status == "paused" else g.status
        d.update(guest_stats(g, now))
        if g.type == "qemu":
            d["memhost"] = g.mem()
    if g.config.get("tags"):  # as the config holds them (an older or hand-written one: unnormalised)
        d["tags"] = str(g.config["tags"])
    if g.pool:
        d["pool"] = g.pool
    if g.ha:
        d["hastate"] = g.ha.get("state", "started")
    if g.lock:
        d["lock"] = g.lock
    return d


def storage_usage(s: Storage, online: bool) -> dict[str, int] | None:
    if not s.enabled or not s.active or not online or s.total is None:
        return None
    used = s.used or 0
    return {"total": s.total, "used": used, "avail": s.total - used}


def storage_resource(s: Storage, node: Node, online: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "id": f"storage/{node.name}/{s.id}",
        "type": "storage",
        "storage": s.id,
        "node": node.name,
        "plugintype": s.type,
        "shared": 1 if s.shared else 0,
        "content": ",".join(s.content),
    }
    usage = storage_usage(s, online)
    d["status"] = "available" if s.active and online else "unknown"
    if usage is not None:
        d["disk"] = usage["used"]
        d["maxdisk"] = usage["total"]
    return d


def cluster_resources(cl: Cluster, now: float, rtype: str | None, off: list[str]) -> list[dict[str, Any]]:
    """Unfiltered resources; the API layer filters by ACL."""
    out: list[dict[str, Any]] = []
    if rtype in (None, "vm"):
        out.extend(guest_resource(cl, g, now, off) for g in sorted(cl.guests.values(), key=lambda g: g.vmid))
    if rtype in (None, "node"):
        for n in cl.nodes.values():
            d = node_entry(n, now, is_online(n, off))
            if is_online(n, off):
                d["cgroup-mode"] = 2
            out.append(d)
    if rtype in (None, "storage"):
        for n in cl.nodes.values():
            on = is_online(n, off)
            out.extend(storage_resource(s, n, on) for s in cl.storages_on(n.name) if s.enabled)
    if rtype is None:
        out.extend({"id": f"/pool/{p.id}", "type": "pool", "pool": p.id} for p in cl.pools.values())
    if rtype in (None, "sdn"):
        for n in cl.nodes.values():
            out.append(
                {
                    "id": f"sdn/{n.name}/localnetwork",
                    "type": "sdn",
                    "sdn": "localnetwork",
                    "node": n.name,
                    "status": "ok" if is_online(n, off) else "unknown",
                }
            )
    return out


def cluster_status(cl: Cluster, off: list[str]) -> list[dict[str, Any]]:
    online = sum(1 for n in cl.nodes.values() if is_online(n, off))
    quorate = 1 if online * 2 > len(cl.nodes) else 0
    out: list[dict[str, Any]] = [
        {
            "type": "cluster",
            "id": "cluster",
            "name": cl.name,
            "nodes": len(cl.nodes),
            "quorate": quorate,
            "version": cl.config_version,
        }
    ]
    local = cl.local_node()
    for n in cl.nodes.values():
        out.append(
            {
                "type": "node",
                "id": f"node/{n.name}",
                "name": n.name,
                "nodeid": n.nodeid,
                "ip": n.ip,
                "online": 1 if is_online(n, off) else 0,
                "local": 1 if n.name == local else 0,
                "level": n.level,
            }
        )
    return out


def now() -> float:
    return time.time()
