"""Ceph as pveceph shows it: OSDs in the CRUSH tree, pools, monitors, managers, MDS,
file systems, CRUSH rules and the cluster flags.

The scenario gives the `ceph status` document (`Cluster.ceph`); the daemons and OSDs
behind it are derived once from the nodes (two OSDs per node unless the scenario's
`ceph.osds` lists them) into `Cluster.ceph_detail`. A change (an OSD set in or out, a
flag) updates both, so `GET /cluster/ceph/status` shows it: the osdmap counts, and an
OSDMAP_FLAGS health warning while a flag is set, with `ceph health detail` lines.
"""

from __future__ import annotations

from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.routes import Ctx, route
from gateway.sim.state import Cluster

GiB = 1 << 30
FLAGS = {
    "nobackfill": "Backfilling of PGs is suspended.",
    "nodeep-scrub": "Deep Scrubbing is disabled.",
    "nodown": "OSD failure reports are being ignored, such that the monitors will not mark OSDs down.",
    "noin": "OSDs that were previously marked out will not be marked back in when they start.",
    "noout": "OSDs will not automatically be marked out after the configured interval.",
    "norebalance": "Rebalancing of PGs is suspended.",
    "norecover": "Recovery of PGs is suspended.",
    "noscrub": "Scrubbing is disabled.",
    "notieragent": "Cache tiering activity is suspended.",
    "noup": "OSDs are not allowed to start.",
    "pause": "Pauses read and writes.",
}
VERSION = "19.2.1"  # squid, as PVE 8.4 / 9.1 ship it
RELEASE = "squid"


def model(cl: Cluster) -> dict[str, Any]:
    """The detail behind the status document; PVE's error when Ceph is not set up."""
    if not cl.ceph:
        raise ApiError(500, "pveceph configuration not initialized")
    if not cl.ceph_detail:
        cl.ceph_detail = _derive(cl)
        _sync_status(cl)
    return cl.ceph_detail


def _derive(cl: Cluster) -> dict[str, Any]:
    raw = cl.ceph or {}
    nodes = list(cl.nodes.values())
    osds = [dict(o) for o in raw.get("osds") or []] or [
        {"id": 2 * i + k, "host": n.name, "device_class": "ssd", "size_gb": 320, "used_gb": 95 + 7 * (2 * i + k)}
        for i, n in enumerate(nodes)
        for k in range(2)
    ]
    for o in osds:
        o.setdefault("up", True)
        o.setdefault("in", True)
        o.setdefault("device_class", "ssd")
    quorum = raw.get("quorum_names") or [n.name for n in nodes[:3]]
    pools = [
        {"pool": 1, "pool_name": ".mgr", "application": "mgr", "pg_num": 1, "bytes_used": 2 << 20},
        {"pool": 2, "pool_name": "vm", "application": "rbd", "pg_num": 64, "bytes_used": 532 * GiB},
        {"pool": 3, "pool_name": "cephfs_data", "application": "cephfs", "pg_num": 32, "bytes_used": 60 * GiB},
        {"pool": 4, "pool_name": "cephfs_metadata", "application": "cephfs", "pg_num": 32, "bytes_used": 1 * GiB},
    ]
    for p in pools:
        p.update(size=3, min_size=2, crush_rule=0, crush_rule_name="replicated_rule", pg_autoscale_mode="on",
                 type="replicated")  # fmt: skip
    ip = {n.name: n.ip for n in nodes}
    return {
        "osds": osds,
        "pools": pools,
        "mons": [
            {"name": m, "host": m, "addr": f"{ip.get(m, '10.0.0.1')}:6789/0", "rank": r} for r, m in enumerate(quorum)
        ],
        "mgrs": [
            {"name": n.name, "host": n.name, "addr": f"{n.ip}:0", "state": "active" if i == 0 else "standby"}
            for i, n in enumerate(nodes[:3])
        ],
        "mds": [  # one active, one standby
            {"name": n.name, "host": n.name, "addr": f"{n.ip}:6801", "state": "up:active" if i == 0 else "up:standby"}
            | ({"rank": 0} if i == 0 else {})
            for i, n in enumerate(nodes[:2])
        ],
        "fs": [{"name": "cephfs", "data_pool": "cephfs_data", "metadata_pool": "cephfs_metadata"}],
        "rules": [{"name": "replicated_rule", "id": 0}],
        "flags": sorted(raw.get("flags") or []),
    }


def _sync_status(cl: Cluster) -> None:
    """The parts of `ceph status` the detail decides: osdmap counts, flag warnings, health."""
    d = cl.ceph_detail
    st = cl.ceph or {}
    osdmap = st.setdefault("osdmap", {})
    osdmap["num_osds"] = len(d["osds"])
    osdmap["num_up_osds"] = sum(1 for o in d["osds"] if o["up"])
    osdmap["num_in_osds"] = sum(1 for o in d["osds"] if o["in"])
    health = st.setdefault("health", {"status": "HEALTH_OK", "checks": {}})
    checks = health.setdefault("checks", {})
    for check in checks.values():  # PVE reads `ceph health detail`: every check has its detail lines
        check.setdefault("detail", [{"message": check.get("summary", {}).get("message", "")}])
    flags = sorted(d["flags"])
    if flags:
        message = f"{','.join(flags)} flag(s) set"
        checks["OSDMAP_FLAGS"] = {
            "severity": "HEALTH_WARN",
            "summary": {"message": message, "count": len(flags)},
            "detail": [{"message": message}],
            "muted": False,
        }
    else:
        checks.pop("OSDMAP_FLAGS", None)
    order = ["HEALTH_OK", "HEALTH_WARN", "HEALTH_ERR"]
    health["status"] = max((c.get("severity", "HEALTH_WARN") for c in checks.values()), key=order.index,
                           default="HEALTH_OK")  # fmt: skip
    cl.touch()


def _osd(d: dict[str, Any], osdid: int) -> dict[str, Any]:
    osd: dict[str, Any] | None = next((o for o in d["osds"] if o["id"] == osdid), None)
    if osd is None:
        raise ApiError(500, f"no such OSD '{osdid}'")
    return osd


# ---- reads -----------------------------------------------------------------------------------


@route("GET", "/nodes/{node}/ceph/osd")
def get_osd_tree(ctx: Ctx) -> Any:
    d = model(ctx.rt.cluster)
    hosts = []
    for i, host in enumerate(dict.fromkeys(o["host"] for o in d["osds"])):
        children = []
        for o in (o for o in d["osds"] if o["host"] == host):
            size, used = int(o["size_gb"]) * GiB, int(o["used_gb"]) * GiB
            children.append({
                "id": o["id"], "name": f"osd.{o['id']}", "type": "osd", "host": host, "leaf": 1,
                "status": "up" if o["up"] else "down", "in": int(o["in"]), "reweight": 1.0 if o["in"] else 0.0,
                "crush_weight": round(size / (1 << 40), 5), "device_class": o["device_class"],
                "osdtype": "bluestore", "total_space": size, "bytes_used": used,
                "percent_used": round(100 * used / size, 2), "version": VERSION,
            })  # fmt: skip
        hosts.append({"id": -2 - i, "name": host, "type": "host", "children": children, "version": VERSION})
    root = {"id": -1, "name": "default", "type": "root", "children": hosts}
    return {"root": {"children": [root], "leaf": 0}, "flags": ",".join(sorted(d["flags"]))}


@route("GET", "/nodes/{node}/ceph/osd/{osdid}/metadata")
def get_osd_metadata(ctx: Ctx) -> Any:
    o = _osd(model(ctx.rt.cluster), int(ctx.params["osdid"]))
    node = ctx.rt.cluster.nodes.get(o["host"])
    addr = f"{node.ip if node else '10.0.0.1'}:6802"
    return {
        "osd": {"id": o["id"], "hostname": o["host"], "osd_data": f"/var/lib/ceph/osd/ceph-{o['id']}",
                "osd_objectstore": "bluestore", "version": VERSION, "front_addr": addr, "back_addr": addr,
                "hb_front_addr": addr, "hb_back_addr": addr, "mem_usage": 3 << 30, "pid": 4000 + o["id"]},
        "devices": [{"device": "block", "dev_node": f"/dev/dm-{o['id']}", "devices": f"nvme{o['id']}n1",
                     "size": int(o["size_gb"]) * GiB, "support_discard": 1, "type": o["device_class"]}],
    }  # fmt: skip


@route("GET", "/nodes/{node}/ceph/pool")
def get_pools(ctx: Ctx) -> Any:
    d = model(ctx.rt.cluster)
    total = sum(int(o["size_gb"]) for o in d["osds"] if o["in"]) * GiB or 1
    return [
        {**{k: v for k, v in p.items() if k != "application"}, "percent_used": round(p["bytes_used"] / total, 6),
         "application_metadata": {p["application"]: {}}}
        for p in d["pools"]
    ]  # fmt: skip


@route("GET", "/nodes/{node}/ceph/pool/{name}/status")
def get_pool_status(ctx: Ctx) -> Any:
    d = model(ctx.rt.cluster)
    name = str(ctx.params["name"])
    p = next((p for p in d["pools"] if p["pool_name"] == name), None)
    if p is None:
        raise ApiError(500, f"pool '{name}' does not exist")  # what `ceph osd pool get` answers, via PVE
    return {
        "id": p["pool"], "name": name, "size": p["size"], "min_size": p["min_size"], "pg_num": p["pg_num"],
        "pgp_num": p["pg_num"], "pg_autoscale_mode": p["pg_autoscale_mode"], "crush_rule": p["crush_rule_name"],
        "application": p["application"], "application_list": [p["application"]], "fast_read": 0, "hashpspool": 1,
        "nodelete": 0, "nopgchange": 0, "nosizechange": 0, "noscrub": 0, "nodeep-scrub": 0, "use_gmt_hitset": 1,
        "write_fadvise_dontneed": 0,
    }  # fmt: skip


@route("GET", "/nodes/{node}/ceph/mon")
def get_mons(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    d = model(cl)
    quorum = set((cl.ceph or {}).get("quorum_names") or [m["name"] for m in d["mons"]])
    return [
        {**m, "host": 1, "quorum": int(m["name"] in quorum), "state": "running", "service": 1, "direxists": "1",
         "ceph_version": f"ceph version {VERSION} ({RELEASE} stable)", "ceph_version_short": VERSION}
        for m in d["mons"]
    ]  # fmt: skip


@route("GET", "/nodes/{node}/ceph/mgr")
def get_mgrs(ctx: Ctx) -> Any:
    return [dict(m) for m in model(ctx.rt.cluster)["mgrs"]]


@route("GET", "/nodes/{node}/ceph/mds")
def get_mds(ctx: Ctx) -> Any:
    return [{**m, "standby_replay": 0} for m in model(ctx.rt.cluster)["mds"]]


@route("GET", "/nodes/{node}/ceph/fs")
def get_fs(ctx: Ctx) -> Any:
    return [dict(f) for f in model(ctx.rt.cluster)["fs"]]


@route("GET", "/nodes/{node}/ceph/rules")
def get_rules(ctx: Ctx) -> Any:
    return [{"name": r["name"]} for r in model(ctx.rt.cluster)["rules"]]


@route("GET", "/cluster/ceph/flags")
def get_flags(ctx: Ctx) -> Any:
    d = model(ctx.rt.cluster)
    return [{"name": f, "description": text, "value": int(f in d["flags"])} for f, text in FLAGS.items()]


@route("GET", "/cluster/ceph/flags/{flag}")
def get_flag(ctx: Ctx) -> Any:
    return int(str(ctx.params["flag"]) in model(ctx.rt.cluster)["flags"])


# ---- changes -------------------------------------------------------------------------------------


@route("PUT", "/cluster/ceph/flags/{flag}")
def put_flag(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    d = model(cl)
    flag = str(ctx.params["flag"])
    d["flags"] = sorted(set(d["flags"]) | {flag} if int(ctx.params["value"]) else set(d["flags"]) - {flag})
    _sync_status(cl)
    return None


def _set_in(ctx: Ctx, value: bool) -> None:
    cl = ctx.rt.cluster
    osd = _osd(model(cl), int(ctx.params["osdid"]))
    osd["in"] = value
    _sync_status(cl)


@route("POST", "/nodes/{node}/ceph/osd/{osdid}/in")
def post_osd_in(ctx: Ctx) -> Any:
    _set_in(ctx, True)
    return None


@route("POST", "/nodes/{node}/ceph/osd/{osdid}/out")
def post_osd_out(ctx: Ctx) -> Any:
    _set_in(ctx, False)
    return None
