"""Cluster-wide objects as PVE keeps them: resource pools and their members, datacenter
options, storage replication jobs (a run copies the guest's ZFS volumes to the target node;
deleting a job removes those copies unless kept), the next free id, the cluster log and the
metrics servers (whose tokens PVE keeps in /etc/pve/priv and never returns).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

from gateway.sim import disks
from gateway.sim.errors import ApiError
from gateway.sim.routes import Ctx, route
from gateway.sim.state import Cluster, Pool, Volume

# ---- pools -----------------------------------------------------------------------


def _pool(cl: Cluster, poolid: str) -> Pool:
    p = cl.pools.get(poolid)
    if p is None:
        raise ApiError(500, f"pool '{poolid}' does not exist")
    return p


def _ids(raw: Any) -> list[str]:
    return [x.strip() for x in str(raw or "").replace(";", ",").split(",") if x.strip()]


@route("POST", "/pools")
def post_pool(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    poolid = str(ctx.params["poolid"])
    if poolid in cl.pools:
        raise ApiError(500, f"create pool failed: pool '{poolid}' already exists")
    cl.pools[poolid] = Pool(id=poolid, comment=str(ctx.params.get("comment") or ""))
    cl.touch()
    return None


@route("PUT", "/pools")
def put_pool(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    pool = _pool(cl, str(p["poolid"]))
    delete = bool(p.get("delete"))
    vmids = [int(v) for v in _ids(p.get("vms"))]
    storages = _ids(p.get("storage"))
    for vmid in vmids:  # check everything first: PVE changes nothing when one member is wrong
        g = cl.guests.get(vmid)
        if g is None:
            raise ApiError(500, f"update pools failed: VM {vmid} does not exist")
        ctx.require(f"/vms/{vmid}", "VM.Allocate")
        if delete and g.pool != pool.id:
            raise ApiError(500, f"update pools failed: VM {vmid} is not a pool member")
        if not delete and g.pool and g.pool != pool.id and not p.get("allow-move"):
            raise ApiError(500, f"update pools failed: VM {vmid} belongs already to pool '{g.pool}'")
    for sid in storages:
        if sid not in cl.storages:
            raise ApiError(500, f"update pools failed: storage '{sid}' does not exist")
        if delete and sid not in pool.storages:
            raise ApiError(500, f"update pools failed: storage '{sid}' is not a pool member")
    if "comment" in p:
        pool.comment = str(p["comment"])
    for vmid in vmids:
        cl.guests[vmid].pool = None if delete else pool.id
    for sid in storages:
        if delete:
            pool.storages.remove(sid)
        elif sid not in pool.storages:
            pool.storages.append(sid)
    cl.touch()
    return None


@route("DELETE", "/pools")
def delete_pool(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    pool = _pool(cl, str(ctx.params["poolid"]))
    if pool.storages or any(g.pool == pool.id for g in cl.guests.values()):
        raise ApiError(500, f"delete pool failed: pool '{pool.id}' is not empty")
    del cl.pools[pool.id]
    cl.touch()
    return None


# ---- options, next id, log ---------------------------------------------------------


@route("GET", "/cluster/options")
def get_options(ctx: Ctx) -> Any:
    return {
        "keyboard": "en-us",
        "language": "en",
        "console": "html5",
        "migration": {"type": "secure", "network": "10.10.0.0/24"},
        "ha": {"shutdown_policy": "conditional"},
        "mac_prefix": "BC:24:11",
        "tag-style": {"ordering": "config", "shape": "circle"},
        "max_workers": 4,
        "email_from": "pve@lab.internal",
        "description": "simulated datacenter",
    }


@route("GET", "/cluster/nextid")
def get_nextid(ctx: Ctx) -> Any:
    used = set(ctx.rt.cluster.guests)
    want = ctx.params.get("vmid")
    if want is not None:
        if int(want) in used:
            raise ApiError(400, "Parameter verification failed.", {"vmid": f"VM {want} already exists"})
        return int(want)
    vmid = 100
    while vmid in used:
        vmid += 1
    return vmid


@route("GET", "/cluster/log")
def get_cluster_log(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    entries: list[dict[str, Any]] = []
    for t in cl.tasks.values():
        entries.append({"time": t.starttime, "node": t.node, "user": t.user, "tag": "pvedaemon", "pid": t.pid,
                        "pri": 6, "msg": f"starting task {t.upid}"})  # fmt: skip
        if t.endtime is not None:
            pri = 6 if t.exitstatus == "OK" else 3
            entries.append({"time": t.endtime, "node": t.node, "user": t.user, "tag": "pvedaemon", "pid": t.pid,
                            "pri": pri, "msg": f"end task {t.upid} {t.exitstatus}"})  # fmt: skip
    start = int(cl.created)
    for i, n in enumerate(cl.nodes.values()):
        entries.append({"time": start - 3600 + i, "node": n.name, "user": "root@pam", "tag": "pvedaemon", "pid": 1200,
                        "pri": 6, "msg": "successful auth for user 'root@pam'"})  # fmt: skip
    entries.sort(key=lambda e: (e["time"], e["msg"]), reverse=True)
    out = entries[: int(ctx.params.get("max", 50))]
    for i, e in enumerate(out):
        e["uid"] = f"{e['time']:08X}:{i:08X}"
        e["id"] = f"{e['uid']}:{e['node']}"
    return out


# ---- metrics servers ---------------------------------------------------------------

DEFAULT_METRICS = [
    {"id": "influx_lab", "type": "influxdb", "server": "10.10.0.70", "port": 8086, "influxdbproto": "https",
     "bucket": "proxmox", "organization": "lab", "verify-certificate": 1, "disable": 0},
    {"id": "graphite1", "type": "graphite", "server": "10.10.0.71", "port": 2003, "path": "proxmox", "proto": "udp",
     "disable": 1},
]  # fmt: skip


def _metrics(cl: Cluster) -> list[dict[str, Any]]:
    if cl.metrics_servers is None:
        cl.metrics_servers = [dict(m) for m in DEFAULT_METRICS]
    return cl.metrics_servers


@route("GET", "/cluster/metrics/server")
def get_metrics_servers(ctx: Ctx) -> Any:
    return [{k: m[k] for k in ("id", "type", "server", "port", "disable")} for m in _metrics(ctx.rt.cluster)]


@route("GET", "/cluster/metrics/server/{id}")
def get_metrics_server(ctx: Ctx) -> Any:
    for m in _metrics(ctx.rt.cluster):
        if m["id"] == ctx.params["id"]:
            return {
                **m,
                "digest": hashlib.sha1(json.dumps(m, sort_keys=True).encode(), usedforsecurity=False).hexdigest(),
            }
    raise ApiError(500, f"metric server '{ctx.params['id']}' does not exist")


# ---- replication ----------------------------------------------------------------------


def _job(cl: Cluster, jid: str) -> dict[str, Any]:
    for j in cl.replication_jobs:
        if j["id"] == jid:
            return j
    raise ApiError(500, f"replication job '{jid}' does not exist")


def _guest_volumes(cl: Cluster, vmid: int) -> list[str]:
    g = cl.guests[vmid]
    return [v for key, line in g.config.items() if disks.is_disk(g.type, key) and not key.startswith("unused")
            and "media=cdrom" not in str(line) and (v := disks.volid_of(str(line)))]  # fmt: skip


@route("POST", "/cluster/replication")
def post_replication(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    jid = str(p["id"])
    guest_s, _, num = jid.partition("-")
    vmid = int(guest_s)
    g = cl.guests.get(vmid)
    if g is None:
        raise ApiError(500, f"create replication job failed: guest '{vmid}' does not exist")
    ctx.require(f"/vms/{vmid}", "VM.Audit")
    if any(j["id"] == jid for j in cl.replication_jobs):
        raise ApiError(500, f"create replication job failed: replication job '{jid}' already exists")
    target = str(p["target"])
    if target not in cl.nodes:
        raise ApiError(500, f"create replication job failed: no such node '{target}'")
    if target == g.node:
        raise ApiError(500, "create replication job failed: source and target node are the same")
    if any(j["guest"] == vmid and j["target"] == target for j in cl.replication_jobs):
        raise ApiError(500, f"create replication job failed: guest {vmid} already has a job to node '{target}'")
    for volid in _guest_volumes(cl, vmid):
        s = cl.storages.get(volid.split(":", 1)[0])
        if s is None or s.type != "zfspool" or (s.nodes is not None and target not in s.nodes):
            raise ApiError(500, f"create replication job failed: missing replicate feature on volume '{volid}'")
    job: dict[str, Any] = {"id": jid, "type": "local", "guest": vmid, "jobnum": int(num), "target": target,
                           "source": g.node, "schedule": str(p.get("schedule") or "*/15")}  # fmt: skip
    for k in ("rate", "comment"):
        if p.get(k) not in (None, ""):
            job[k] = p[k]
    if p.get("disable"):
        job["disable"] = 1
    job["_state"] = {"last_sync": 0, "last_try": 0, "duration": 0, "fail_count": 0}
    cl.replication_jobs.append(job)
    cl.touch()
    return None


def _public(job: dict[str, Any]) -> dict[str, Any]:
    d = {k: v for k, v in job.items() if not k.startswith("_")}
    d["digest"] = hashlib.sha1(json.dumps(d, sort_keys=True).encode(), usedforsecurity=False).hexdigest()
    return d


@route("GET", "/cluster/replication/{id}")
def get_replication_job(ctx: Ctx) -> Any:
    job = _job(ctx.rt.cluster, str(ctx.params["id"]))
    ctx.require(f"/vms/{job['guest']}", "VM.Audit")
    return _public(job)


@route("PUT", "/cluster/replication/{id}")
def put_replication_job(ctx: Ctx) -> Any:
    job = _job(ctx.rt.cluster, str(ctx.params["id"]))
    p = ctx.params
    for k in ("schedule", "rate", "comment"):
        if k in p:
            job[k] = p[k]
    if "disable" in p:
        if p["disable"]:
            job["disable"] = 1
        else:
            job.pop("disable", None)
    ctx.rt.cluster.touch()
    return None


@route("DELETE", "/cluster/replication/{id}")
def delete_replication_job(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    job = _job(cl, str(ctx.params["id"]))
    if not ctx.params.get("keep"):  # the replicated copies on the target go with the job
        for volid in _guest_volumes(cl, job["guest"]):
            for v in [v for v in cl.volumes if v.volid == volid and v.node == job["target"]]:
                cl.volumes.remove(v)
    cl.replication_jobs.remove(job)
    cl.touch()
    return None


def _run(cl: Cluster, job: dict[str, Any]) -> None:
    """One replication run: copy (or refresh) the guest's volumes on the target node."""
    st = job["_state"]
    st["last_try"] = int(time.time())
    if job not in cl.replication_jobs:
        return
    g = cl.guests.get(job["guest"])
    if g is None:
        st["fail_count"] += 1
        st["error"] = f"guest {job['guest']} does not exist"
        return
    for volid in _guest_volumes(cl, g.vmid):
        src = next((v for v in cl.volumes if v.volid == volid and v.node in (None, g.node)), None)
        if src is None or any(v.volid == volid and v.node == job["target"] for v in cl.volumes):
            continue
        cl.volumes.append(Volume(storage=src.storage, volid=volid, content=src.content, format=src.format,
                                 size=src.size, node=job["target"], vmid=g.vmid, ctime=int(time.time())))  # fmt: skip
    st.update(last_sync=int(time.time()), duration=0.4, fail_count=0)
    st.pop("error", None)
    cl.touch()


@route("POST", "/nodes/{node}/replication/{id}/schedule_now")
def post_schedule_now(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    job = _job(cl, str(ctx.params["id"]))
    if job["source"] != ctx.params["node"]:
        raise ApiError(500, f"replication job '{job['id']}' does not run on node '{ctx.params['node']}'")
    job["_state"]["next_sync"] = int(time.time())
    asyncio.get_running_loop().call_later(ctx.rt.task_seconds(), _run, cl, job)  # pvescheduler picks it up
    return None


@route("GET", "/nodes/{node}/replication/{id}/status")
def get_replication_status(ctx: Ctx) -> Any:
    job = _job(ctx.rt.cluster, str(ctx.params["id"]))
    ctx.require(f"/vms/{job['guest']}", "VM.Audit")
    if job["source"] != ctx.params["node"]:
        raise ApiError(500, f"replication job '{job['id']}' does not run on node '{ctx.params['node']}'")
    st = job["_state"]
    d = {k: v for k, v in _public(job).items() if k != "digest"}
    d.update(last_sync=st["last_sync"], last_try=st["last_try"], duration=st["duration"], fail_count=st["fail_count"])
    if st.get("error"):
        d["error"] = st["error"]
    if not job.get("disable"):
        d["next_sync"] = st.get("next_sync") or (max(st["last_sync"], int(time.time())) // 900 + 1) * 900
    d["state"] = "error" if st.get("error") else "ok"
    return d
