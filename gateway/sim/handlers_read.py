"""Read-only (GET) endpoints. List endpoints filter by ACL the way PVE does."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from gateway.sim import handlers_ceph, views
from gateway.sim.auth import Principal
from gateway.sim.errors import ApiError
from gateway.sim.nodeops import network_changes, ops
from gateway.sim.routes import Ctx, RawBody, Reply, both, kind_of, route
from gateway.sim.state import Guest, Storage, Task
from gateway.sim.tasks import UPID_RE


@route("GET", "/version")
def get_version(ctx: Ctx) -> Any:
    return views.version(ctx.rt.cluster)


@route("GET", "/cluster/status")
def get_cluster_status(ctx: Ctx) -> Any:
    return views.cluster_status(ctx.rt.cluster, ctx.rt.faults.offline_nodes)


def visible_resource(ctx: Ctx, r: dict[str, Any]) -> dict[str, Any] | None:
    t = r["type"]
    if t in ("qemu", "lxc"):
        if not ctx.can(f"/vms/{r['vmid']}", "VM.Audit"):
            return None
        if "pool" in r and not ctx.can(f"/pool/{r['pool']}", "Pool.Audit"):
            # PVE::API2::Cluster resources: `delete $entry->{pool}` without Pool.Audit on the pool
            return {k: v for k, v in r.items() if k != "pool"}
        return r
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


# ---- nodes -------------------------------------------------------------------


@route("GET", "/nodes/{node}/status")
def get_node_status(ctx: Ctx) -> Any:
    n = ctx.rt.cluster.nodes[ctx.params["node"]]
    now = time.time()
    load = n.cpu_load * n.maxcpu
    rel = n.kernel
    ver = "#1 SMP PREEMPT_DYNAMIC PMX 6.8.12-4 (2024-11-06T15:04Z)"
    return {
        "uptime": int(now - n.boot_time),
        "idle": 0,
        "loadavg": [f"{load:.2f}", f"{load * 1.1:.2f}", f"{load * 1.2:.2f}"],
        "cpu": n.cpu_load,
        "wait": 0.0004,
        "kversion": f"Linux {rel} {ver}",
        "current-kernel": {"sysname": "Linux", "release": rel, "version": ver, "machine": "x86_64"},
        "boot-info": {"mode": "efi", "secureboot": 0},
        "cpuinfo": {
            "model": n.cpu_model,
            "vendor": "GenuineIntel",
            "family": "6",
            "sockets": 1,
            "cores": n.maxcpu // 2,
            "cpus": n.maxcpu,
            "mhz": "2399.998",
            "hvm": "1",
            "user_hz": 100,
            "flags": "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov vmx aes avx avx2",
        },
        "memory": {"total": n.maxmem, "used": n.mem, "free": n.maxmem - n.mem, "available": n.maxmem - n.mem},
        "swap": {"total": 8589930496, "used": 0, "free": 8589930496},
        "ksm": {"shared": 0},
        "rootfs": {"total": n.maxdisk, "used": n.disk, "avail": n.maxdisk - n.disk, "free": n.maxdisk - n.disk},
        "pveversion": f"pve-manager/{ctx.rt.cluster.version}/{ctx.rt.cluster.repoid}",
    }


@route("GET", "/nodes/{node}/network")
def get_node_network(ctx: Ctx) -> Any:
    node = ctx.params["node"]
    ctx.require(f"/nodes/{node}", "Sys.Audit")  # schema: user:all, Nodes.pm checks inside
    pending = ops(ctx.rt.cluster, node).network_pending  # PVE lists interfaces.new when it exists
    items = pending if pending is not None else ctx.rt.cluster.nodes[node].network
    changes = network_changes(ctx.rt.cluster, node)
    t = ctx.params.get("type")
    if t and t != "any_bridge":
        items = [i for i in items if i["type"] == t]
    elif t == "any_bridge":
        items = [i for i in items if i["type"] in ("bridge", "OVSBridge")]
    return Reply(items, {"changes": changes}) if changes else items


# ---- guests ------------------------------------------------------------------


def _ha_status(g: Guest) -> dict[str, Any]:
    if not g.ha:
        return {"managed": 0}
    d: dict[str, Any] = {"managed": 1, "state": g.ha.get("state", "started")}
    if g.ha.get("group"):
        d["group"] = g.ha["group"]
    return d


def guest_list_entry(ctx: Ctx, g: Guest, now: float) -> dict[str, Any]:
    s = views.guest_stats(g, now)
    running = g.status != "stopped"
    d: dict[str, Any] = {
        "vmid": g.vmid,
        "name": g.name,
        "status": "running" if running else "stopped",
        "uptime": s["uptime"],
        "cpu": s["cpu"],
        "cpus": g.cpus,
        "mem": s["mem"],
        "maxmem": g.maxmem,
        "disk": s["disk"],
        "maxdisk": g.maxdisk,
        "netin": s["netin"],
        "netout": s["netout"],
        "diskread": s["diskread"],
        "diskwrite": s["diskwrite"],
    }
    if running:
        d["pid"] = g.pid
    if g.config.get("tags"):  # as the config holds them
        d["tags"] = str(g.config["tags"])
    if g.lock:
        d["lock"] = g.lock
    if g.template:
        d["template"] = 1
    if g.type == "lxc":
        d["type"] = "lxc"
        d["swap"] = 0
        d["maxswap"] = int(g.config.get("swap", 0)) << 20
    elif ctx.rt.cluster.major >= 9:
        d["qmpstatus"] = g.status if running else "stopped"
        d["serial"] = 0
        if running:
            d["memhost"] = s["mem"]
    return d


@both("GET", "/nodes/{node}/{kind}")
def get_guest_list(ctx: Ctx) -> Any:
    node = ctx.params["node"]
    kind = kind_of(ctx.path)
    now = time.time()
    return [
        guest_list_entry(ctx, g, now)
        for g in sorted(ctx.rt.cluster.guests.values(), key=lambda g: g.vmid)
        if g.node == node and g.type == kind and ctx.can(f"/vms/{g.vmid}", "VM.Audit")
    ]


@both("GET", "/nodes/{node}/{kind}/{vmid}/status/current")
def get_guest_status(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    now = time.time()
    d = guest_list_entry(ctx, g, now)
    d["ha"] = _ha_status(g)
    running = g.status != "stopped"
    if g.type == "qemu":
        d["qmpstatus"] = g.status if running else "stopped"
        d["agent"] = 1 if g.agent else 0
        d["balloon"] = g.maxmem
        if running:
            d["spice"] = 0
            d["freemem"] = g.maxmem - d["mem"]
            d["balloon_min"] = g.maxmem
            d["shares"] = 1000
            d["running-machine"] = "pc-i440fx-9.0+pve0"
            d["running-qemu"] = "9.0.2"
            d["nics"] = {f"tap{g.vmid}i0": {"netin": d["netin"], "netout": d["netout"]}}
            d["ballooninfo"] = {
                "actual": g.maxmem,
                "max_mem": g.maxmem,
                "free_mem": d["freemem"],
                "total_mem": g.maxmem - (64 << 20),
                "last_update": int(now) - 3,
            }
            d["blockstat"] = {
                "scsi0": {
                    "rd_bytes": d["diskread"],
                    "wr_bytes": d["diskwrite"],
                    "account_failed": True,
                    "account_invalid": True,
                    "failed_rd_operations": 0,
                }
            }
            d["proxmox-support"] = {
                "pbs-dirty-bitmap": True,
                "pbs-dirty-bitmap-migration": True,
                "pbs-library-version": "1.4.1 (UNKNOWN)",
                "query-bitmap-info": True,
            }
    else:
        d["type"] = "lxc"
    d["template"] = 1 if g.template else 0
    return d


def config_digest(cfg: dict[str, Any]) -> str:
    text = "".join(f"{k}: {v}\n" for k, v in sorted(cfg.items()))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


@both("GET", "/nodes/{node}/{kind}/{vmid}/config")
def get_guest_config(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cfg = g.config
    snapname = ctx.params.get("snapshot")
    if snapname:
        snap = next((s for s in g.snapshots if s.name == snapname), None)
        if snap is None:
            raise ApiError(500, f"snapshot '{snapname}' does not exist")
        cfg = snap.config
    out = dict(cfg)
    if not snapname and not ctx.params.get("current"):  # PVE answers with pending values by default
        out.update(g.pending)
    if g.lock:
        out["lock"] = g.lock
    out["digest"] = config_digest(g.config)
    return out


@both("GET", "/nodes/{node}/{kind}/{vmid}/snapshot")
def get_snapshots(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    out: list[dict[str, Any]] = []
    for s in g.snapshots:
        d: dict[str, Any] = {"name": s.name, "snaptime": s.snaptime, "description": s.description}
        if g.type == "qemu":
            d["vmstate"] = 1 if s.vmstate else 0
        if s.parent:
            d["parent"] = s.parent
        out.append(d)
    cur: dict[str, Any] = {
        "name": "current",
        "description": "You are here!",
        "digest": config_digest(g.config),
        "running": 1 if g.status != "stopped" else 0,
    }
    if g.snapshots:
        cur["parent"] = g.snapshots[-1].name
    out.append(cur)
    return out


@route("GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces")
def get_agent_interfaces(ctx: Ctx) -> Any:
    g = ctx.guest("qemu")
    if g.status == "stopped":
        raise ApiError(500, f"VM {g.vmid} is not running")
    if not g.agent:
        raise ApiError(500, "No QEMU guest agent configured")
    if not g.agent_running or g.status == "paused":
        raise ApiError(500, "QEMU guest agent is not running")
    result = []
    for i, itf in enumerate(g.interfaces):
        addrs = []
        if itf.get("inet"):
            ip, prefix = itf["inet"].split("/")
            addrs.append({"ip-address": ip, "ip-address-type": "ipv4", "prefix": int(prefix)})
        if itf.get("inet6"):
            ip, prefix = itf["inet6"].split("/")
            addrs.append({"ip-address": ip, "ip-address-type": "ipv6", "prefix": int(prefix)})
        e: dict[str, Any] = {
            "name": itf["name"],
            "hardware-address": itf["hwaddr"],
            "ip-addresses": addrs,
            "statistics": {
                "rx-bytes": g.netin * (i + 1),
                "rx-packets": g.netin // 900,
                "rx-errs": 0,
                "rx-dropped": 0,
                "tx-bytes": g.netout * (i + 1),
                "tx-packets": g.netout // 900,
                "tx-errs": 0,
                "tx-dropped": 0,
            },
        }
        result.append(e)
    return {"result": result}


@route("GET", "/nodes/{node}/lxc/{vmid}/interfaces")
def get_lxc_interfaces(ctx: Ctx) -> Any:
    g = ctx.guest("lxc")
    if g.status != "running":
        raise ApiError(500, f"CT {g.vmid} not running")
    out = []
    for itf in g.interfaces:
        d = {"name": itf["name"], "hwaddr": itf["hwaddr"]}
        if itf.get("inet"):
            d["inet"] = itf["inet"]
        if itf.get("inet6"):
            d["inet6"] = itf["inet6"]
        out.append(d)
    return out


@route("GET", "/nodes/{node}/qemu/{vmid}/firewall/rules")
def get_guest_fw_rules(ctx: Ctx) -> Any:
    g = ctx.guest("qemu")
    return _rules(ctx.rt.cluster.guest_firewall_rules.get(g.vmid, []))


@route("GET", "/cluster/firewall/rules")
def get_cluster_fw_rules(ctx: Ctx) -> Any:
    return _rules(ctx.rt.cluster.firewall_rules)


def _rules(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    digest = hashlib.sha1(json.dumps(rules, sort_keys=True).encode(), usedforsecurity=False).hexdigest()
    out = []
    for r in rules:
        d = dict(r)
        d["digest"] = digest
        if d.get("source") or d.get("dest"):
            d.setdefault("ipversion", 4)
        out.append(d)
    return out


# ---- storage -----------------------------------------------------------------


def _storage_status(ctx: Ctx, s: Storage, node: str) -> dict[str, Any]:
    online = ctx.rt.node_online(node)
    usage = views.storage_usage(s, online)
    d: dict[str, Any] = {
        "storage": s.id,
        "type": s.type,
        "content": ",".join(sorted(s.content)),
        "shared": 1 if s.shared else 0,
        "enabled": 1 if s.enabled else 0,
        "active": 1 if s.active and s.enabled and online else 0,
    }
    if usage is None:
        # disabled, inactive or unmeasurable: PVE still reports zeros (not "full"), with active=0
        d.update(total=0, used=0, avail=0)
    else:
        d.update(usage)
        d["used_fraction"] = usage["used"] / usage["total"] if usage["total"] else 0
    return d


def _storage_on(ctx: Ctx, name: str, node: str) -> Storage:
    s = ctx.rt.cluster.storages.get(name)
    if s is None:
        raise ApiError(500, f"storage '{name}' does not exist")
    if s.nodes is not None and node not in s.nodes:
        raise ApiError(500, f"storage '{name}' is not available on node '{node}'")
    return s


@route("GET", "/nodes/{node}/storage")
def get_node_storage(ctx: Ctx) -> Any:
    node = ctx.params["node"]
    out = []
    for s in ctx.rt.cluster.storages_on(node):
        if not ctx.can(f"/storage/{s.id}", "Datastore.Audit", "Datastore.AllocateSpace"):
            continue
        if ctx.params.get("storage") and s.id != ctx.params["storage"]:
            continue
        if ctx.params.get("content") and not set(str(ctx.params["content"]).split(",")) & set(s.content):
            continue
        if ctx.params.get("enabled") and not s.enabled:
            continue
        out.append(_storage_status(ctx, s, node))
    return out


@route("GET", "/nodes/{node}/storage/{storage}/status")
def get_storage_status(ctx: Ctx) -> Any:
    node = ctx.params["node"]
    s = _storage_on(ctx, ctx.params["storage"], node)
    d = _storage_status(ctx, s, node)
    d.pop("storage")
    d.pop("used_fraction", None)
    return d


@route("GET", "/nodes/{node}/storage/{storage}/content")
def get_storage_content(ctx: Ctx) -> Any:
    node = ctx.params["node"]
    s = _storage_on(ctx, ctx.params["storage"], node)
    if not s.active:
        raise ApiError(500, f"storage '{s.id}' is not online")
    content = ctx.params.get("content")
    vmid = ctx.params.get("vmid")
    allocate = ctx.can(f"/storage/{s.id}", "Datastore.Allocate")
    out = []
    for v in ctx.rt.cluster.volumes:
        if v.storage != s.id or (v.node is not None and v.node != node):
            continue
        if content and v.content != content:
            continue
        if vmid is not None and v.vmid != vmid:
            continue
        # check_volume_access: guest volumes need VM.Audit on the guest unless Datastore.Allocate
        if v.vmid is not None and not allocate and not ctx.can(f"/vms/{v.vmid}", "VM.Audit", "VM.Backup"):
            continue
        d: dict[str, Any] = {"volid": v.volid, "content": v.content, "format": v.format, "size": v.size}
        if v.vmid is not None:
            d["vmid"] = v.vmid
        if v.ctime is not None:
            d["ctime"] = v.ctime
        if v.notes is not None:
            d["notes"] = v.notes
        if v.content == "backup":
            if v.protected:
                d["protected"] = 1
            if v.subtype:
                d["subtype"] = v.subtype
            if s.type == "pbs":
                d["verification"] = {
                    "state": "ok",
                    "upid": f"UPID:pbs:0000{v.vmid:04X}:00000000:00000000:verify:x:root@pam:",
                }
        if v.used is not None:
            d["used"] = v.used
        out.append(d)
    return out


@route("GET", "/storage")
def get_storage_config(ctx: Ctx) -> Any:
    out = []
    for s in ctx.rt.cluster.storages.values():
        if not ctx.can(f"/storage/{s.id}", "Datastore.Audit", "Datastore.AllocateSpace"):
            continue
        if ctx.params.get("type") and s.type != ctx.params["type"]:
            continue
        d: dict[str, Any] = {
            "storage": s.id,
            "type": s.type,
            "content": ",".join(s.content),
            "digest": hashlib.sha1(s.id.encode(), usedforsecurity=False).hexdigest(),
        }
        if s.shared:
            d["shared"] = 1
        if not s.enabled:
            d["disable"] = 1
        if s.nodes:
            d["nodes"] = ",".join(s.nodes)
        if s.path:
            d["path"] = s.path
        if s.server:
            d["server"] = s.server
        if s.type == "lvmthin":
            d.update(thinpool="data", vgname="pve")
        for k, val in s.extra.items():
            if k not in ("password",):
                d[k] = val
        out.append(d)
    return out


# ---- tasks -------------------------------------------------------------------


def _task_fields(t: Task, split_token: bool = True) -> dict[str, Any]:
    """The fields PVE's task list and task status share. An API token's task shows its user and its
    `tokenid` apart (`root@pam` and `gw`, PVE/API2/Tasks.pm convert_token_task) in the task status and
    in rows of finished tasks; only rows of running tasks (`source=active`) keep the token's full id.
    The UPID keeps it either way."""
    user, _, token = t.user.partition("!")
    d: dict[str, Any] = {
        "upid": t.upid,
        "node": t.node,
        "pid": t.pid,
        "pstart": t.pstart,
        "starttime": t.starttime,
        "type": t.type,
        "id": t.id,
        "user": user if split_token else t.user,
    }
    if split_token and token:
        d["tokenid"] = token
    return d


def task_entry(t: Task, active_status: bool = False) -> dict[str, Any]:
    """A task-list row. `active_status`: the node task list's rows of running tasks (source=active or
    all) carry `status: "RUNNING"` (Tasks.pm: `$task->{status} = 'RUNNING' if !$task->{status}`)."""
    d = _task_fields(t, split_token=t.status == "stopped")
    if t.status == "stopped":
        d["status"] = t.exitstatus
        d["endtime"] = t.endtime
    elif active_status:
        d["status"] = "RUNNING"
    return d


def _task_visible(ctx: Ctx, t: Task) -> bool:
    return t.user == ctx.user or ctx.can(f"/nodes/{t.node}", "Sys.Audit")


@route("GET", "/nodes/{node}/tasks")
def get_node_tasks(ctx: Ctx) -> Any:
    p = ctx.params
    node = p["node"]
    source = p.get("source", "archive")  # PVE default: finished tasks only
    start = int(p.get("start", 0))
    limit = int(p.get("limit", 50))
    items = []
    for t in sorted(ctx.rt.cluster.tasks.values(), key=lambda t: (t.starttime, t.pid), reverse=True):
        if t.node != node or not _task_visible(ctx, t):
            continue
        if source == "archive" and t.status == "running":
            continue
        if source == "active" and t.status != "running":
            continue
        if p.get("vmid") is not None and t.id != str(p["vmid"]):
            continue
        if p.get("typefilter") and t.type != p["typefilter"]:
            continue
        # PVE: m/\Q..\E/i on the user, after a finished task's token id was split off it (task_entry):
        # `userfilter=root@pam!gw` finds a token's running tasks only, `userfilter=root@pam` all of them
        shown = t.user if t.status == "running" else t.user.partition("!")[0]
        if p.get("userfilter") and str(p["userfilter"]).lower() not in shown.lower():
            continue
        if p.get("errors") and t.exitstatus in (None, "OK"):
            continue
        if p.get("statusfilter") and not p.get("errors"):
            # upid_normalize_status_type: a running task has no status yet, so it is "unknown"
            cls = "unknown" if t.status == "running" else "ok" if t.exitstatus == "OK" else "error"
            if str(t.exitstatus).startswith("WARNINGS"):
                cls = "warning"
            if cls not in str(p["statusfilter"]).lower().split(","):
                continue
        if p.get("since") and t.starttime < int(p["since"]):
            continue
        if p.get("until") and t.starttime > int(p["until"]):
            continue
        items.append(task_entry(t, active_status=True))
    return Reply(items[start : start + limit], {"total": len(items)})


@route("GET", "/cluster/tasks")
def get_cluster_tasks(ctx: Ctx) -> Any:
    ts = sorted(ctx.rt.cluster.tasks.values(), key=lambda t: (t.starttime, t.pid), reverse=True)
    return [task_entry(t) for t in ts if _task_visible(ctx, t)][:2000]


def _bad_upid(why: str) -> ApiError:
    """PVE/API2/Tasks.pm's raise_param_exc: a 400 naming `upid`, never a handler `die` (500)."""
    return ApiError(400, "Parameter verification failed.", {"upid": why})


def _task(ctx: Ctx) -> Task:
    upid = str(ctx.params["upid"])
    if not UPID_RE.match(upid):
        raise _bad_upid("unable to parse worker upid")
    # the request runs on {node} (proxyto) and looks for the task's file there: another node's task,
    # like one rotated out of the history, is "no such task"
    t = ctx.rt.cluster.tasks.get(upid)
    if t is None or t.node != ctx.params["node"]:
        raise _bad_upid("no such task")
    if not _task_visible(ctx, t):
        ctx.require(f"/nodes/{t.node}", "Sys.Audit")
    return t


@route("GET", "/nodes/{node}/tasks/{upid}/status")
def get_task_status(ctx: Ctx) -> Any:
    t = _task(ctx)
    d = {**_task_fields(t), "status": t.status}
    if t.status == "stopped":
        d["exitstatus"] = t.exitstatus
    return d


@route("GET", "/nodes/{node}/tasks/{upid}/log")
def get_task_log(ctx: Ctx) -> Any:
    """pve-common's dump_logfile: a log file that cannot be opened (a task this node never ran, or one
    rotated out) is one line saying so, an empty log one line "no content" (200 either way: read_task_log
    checks only that the UPID parses); `limit=0` reads to the end."""
    upid = str(ctx.params["upid"])
    if not UPID_RE.match(upid):
        raise _bad_upid("unable to parse worker upid")
    t = ctx.rt.cluster.tasks.get(upid)
    if t is None or t.node != ctx.params["node"]:
        return Reply([{"n": 1, "t": "unable to open file - No such file or directory"}], {"total": 1})
    if not _task_visible(ctx, t):
        ctx.require(f"/nodes/{t.node}", "Sys.Audit")
    start = int(ctx.params.get("start", 0))
    limit = int(ctx.params.get("limit", 50))
    if not t.log:
        return Reply([{"n": 1, "t": "no content"}], {"total": 1})
    lines = [{"n": i + 1, "t": line} for i, line in enumerate(t.log)]
    return Reply(lines[start : start + limit] if limit else lines[start:], {"total": len(lines)})


# ---- cluster-wide --------------------------------------------------------------


@route("GET", "/cluster/ha/resources")
def get_ha_resources(ctx: Ctx) -> Any:
    out = []
    want = ctx.params.get("type")
    for g in sorted(ctx.rt.cluster.guests.values(), key=lambda g: g.vmid):
        if not g.ha:
            continue
        t = "vm" if g.type == "qemu" else "ct"
        if want and want != t:
            continue
        d: dict[str, Any] = {
            "sid": g.sid,
            "type": t,
            "state": g.ha.get("state", "started"),
            "max_restart": g.ha.get("max_restart", 1),
            "max_relocate": g.ha.get("max_relocate", 1),
            "digest": config_digest(g.ha),
        }
        if ctx.rt.cluster.major >= 9:
            d["failback"] = 1
        elif g.ha.get("group"):
            d["group"] = g.ha["group"]
        out.append(d)
    return out


@route("GET", "/cluster/ha/status/current")
def get_ha_status(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    nodes = list(cl.nodes.values())
    online = [n for n in nodes if ctx.rt.node_online(n.name)]
    master = online[0].name if online else nodes[0].name
    quorate = len(online) * 2 > len(nodes)
    ts = int(time.time())
    stamp = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(ts))
    out: list[dict[str, Any]] = [
        {
            "id": "quorum",
            "type": "quorum",
            "node": master,
            "status": "OK" if quorate else f"No quorum on node '{master}'!",
            "quorate": 1 if quorate else 0,
        },
        {"id": "master", "type": "master", "node": master, "status": f"{master} (active, {stamp})", "timestamp": ts},
    ]
    if cl.major >= 9:
        out.append(
            {
                "id": "fencing",
                "type": "fencing",
                "node": master,
                "status": "armed (CRM watchdog active)",
                "armed-state": "armed",
            }
        )
    has_ha = {g.node for g in cl.guests.values() if g.ha}
    for n in nodes:
        if ctx.rt.node_online(n.name):
            st = "active, watchdog active" if n.name in has_ha else "idle"
            out.append(
                {
                    "id": f"lrm:{n.name}",
                    "type": "lrm",
                    "node": n.name,
                    "status": f"{n.name} ({st}, {stamp})",
                    "timestamp": ts,
                }
            )
        else:
            out.append(
                {
                    "id": f"lrm:{n.name}",
                    "type": "lrm",
                    "node": n.name,
                    "status": f"{n.name} (old timestamp - dead?, {stamp})",
                    "timestamp": ts - 3600,
                }
            )
    for g in sorted(cl.guests.values(), key=lambda g: g.vmid):
        if not g.ha:
            continue
        req = g.ha.get("state", "started")
        state = req if ctx.rt.node_online(g.node) else "fence"
        if req == "started" and g.status == "stopped" and state != "fence":
            state = "starting"
        d: dict[str, Any] = {
            "id": f"service:{g.sid}",
            "type": "service",
            "sid": g.sid,
            "node": g.node,
            "crm_state": state,
            "state": state,
            "status": f"{g.sid} ({g.node}, {state})",
            "request_state": req,
            "max_restart": g.ha.get("max_restart", 1),
            "max_relocate": g.ha.get("max_relocate", 1),
        }
        if cl.major >= 9:
            d["failback"] = 1
        elif g.ha.get("group"):
            d["group"] = g.ha["group"]
        out.append(d)
    return out


def _ceph(ctx: Ctx) -> Any:
    ceph = ctx.rt.cluster.ceph
    if not ceph:
        raise ApiError(500, "binary not installed: /usr/bin/ceph-mon")
    handlers_ceph.model(ctx.rt.cluster)  # the OSDs and flags behind it decide its counts and health
    return ceph


@route("GET", "/cluster/ceph/status")
def get_cluster_ceph(ctx: Ctx) -> Any:
    return _ceph(ctx)


@route("GET", "/nodes/{node}/ceph/status")
def get_node_ceph(ctx: Ctx) -> Any:
    return _ceph(ctx)


@route("GET", "/access/permissions")
def get_permissions(ctx: Ctx) -> Any:
    userid = ctx.params.get("userid")
    principal = ctx.principal
    if userid and userid != ctx.user:
        own_token = "!" in userid and userid.split("!", 1)[0] == ctx.principal.userid
        if not own_token:
            ctx.require("/access", "Sys.Audit")
        tok = ctx.rt.cluster.tokens.get(userid)
        if tok is None:
            if "!" in userid:
                raise ApiError(500, f"no such token '{userid.split('!', 1)[1]}' for user '{userid.split('!', 1)[0]}'")
            raise ApiError(500, f"no such user ('{userid}')")
        principal = Principal(tokenid=userid, token=tok)
    return ctx.rt.acl.permissions_map(principal, ctx.params.get("path"))


@route("GET", "/pools")
def get_pools(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    poolid = ctx.params.get("poolid")
    out = []
    for p in cl.pools.values():
        if poolid and p.id != poolid:
            continue
        if not ctx.can(f"/pool/{p.id}", "Pool.Audit"):
            if poolid:
                raise ApiError(403, f"Permission check failed (/pool/{p.id}, Pool.Audit)")
            continue
        d: dict[str, Any] = {"poolid": p.id}
        if p.comment:
            d["comment"] = p.comment
        if poolid:
            now = time.time()
            members: list[dict[str, Any]] = []
            want = ctx.params.get("type")
            for g in sorted(cl.guests.values(), key=lambda g: g.vmid):
                if g.pool == p.id and want in (None, g.type):
                    members.append(views.guest_resource(cl, g, now, ctx.rt.faults.offline_nodes))
            for sid in p.storages:
                if want in (None, "storage"):
                    s = cl.storages[sid]
                    n = cl.nodes[cl.local_node()]
                    members.append(views.storage_resource(s, n, ctx.rt.node_online(n.name)))
            d["members"] = members
        out.append(d)
    if poolid and not out:
        raise ApiError(500, f"pool '{poolid}' does not exist")
    return out


# ---- further endpoints the connector catalog uses --------------------------------


@route("GET", "/nodes/{node}/version")
def get_node_version(ctx: Ctx) -> Any:
    return views.version(ctx.rt.cluster)


@route("GET", "/nodes/{node}/dns")
def get_node_dns(ctx: Ctx) -> Any:
    n = ctx.rt.cluster.nodes[ctx.params["node"]]
    gw = n.ip.rsplit(".", 1)[0] + ".1"
    return {"search": "lab.internal", "dns1": gw, "dns2": "9.9.9.9"}


@route("GET", "/nodes/{node}/services")
def get_node_services(ctx: Ctx) -> Any:
    services = ops(ctx.rt.cluster, ctx.params["node"]).services  # the state restarts change
    return [dict(v) for v in services.values()]


@both("GET", "/nodes/{node}/{kind}/{vmid}/pending")
def get_pending(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    rows: list[dict[str, Any]] = []
    for k in sorted(set(g.config) | set(g.pending)):
        row: dict[str, Any] = {"key": k}
        if k in g.config:
            row["value"] = g.config[k]
        if k in g.pending:
            row["pending"] = g.pending[k]
        rows.append(row)
    return rows


@both("GET", "/nodes/{node}/{kind}/{vmid}/migrate")
def get_migrate_precondition(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cl = ctx.rt.cluster
    running = g.status != "stopped"
    local_disks = [
        {"volid": v.volid, "size": v.size, "drivename": "scsi0" if g.type == "qemu" else "rootfs", "is_attached": 1}
        for v in cl.volumes
        if v.vmid == g.vmid and v.content in ("images", "rootdir") and not cl.storages[v.storage].shared
    ]
    others = [n for n in cl.nodes if n != g.node]
    allowed = [n for n in others if ctx.rt.node_online(n)]
    d: dict[str, Any] = {
        "running": 1 if running else 0,
        "allowed_nodes": allowed,
        "not_allowed_nodes": {n: {"unavailable_storages": []} for n in others if n not in allowed},
        "local_disks": local_disks if g.type == "qemu" else [],
        "local_resources": [],
        "mapped-resources": [],
    }
    if g.type == "lxc":
        d = {"running": d["running"], "allowed-nodes": allowed, "not-allowed-nodes": d["not_allowed_nodes"]}
    return d


@route("GET", "/nodes/{node}/lxc/{vmid}/firewall/rules")
def get_lxc_fw_rules(ctx: Ctx) -> Any:
    g = ctx.guest("lxc")
    return _rules(ctx.rt.cluster.guest_firewall_rules.get(g.vmid, []))


@route("GET", "/cluster/backup-info/not-backed-up")
def get_not_backed_up(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    covered: set[int] = set()
    for j in cl.backup_jobs:
        if not j.get("enabled", 1):
            continue
        if j.get("all"):
            excl = {int(x) for x in str(j.get("exclude", "")).split(",") if x}
            covered |= {v for v in cl.guests if v not in excl}
        if j.get("pool"):
            covered |= {g.vmid for g in cl.guests.values() if g.pool == j["pool"]}
        covered |= {int(x) for x in str(j.get("vmid", "")).split(",") if x.strip()}
    return [
        {"vmid": g.vmid, "name": g.name, "type": g.type}
        for g in sorted(cl.guests.values(), key=lambda g: g.vmid)
        if g.vmid not in covered and not g.template
    ]


@route("GET", "/cluster/ha/groups")
def get_ha_groups(ctx: Ctx) -> Any:
    out = []
    for name, h in ctx.rt.cluster.ha_groups.items():
        out.append(
            {
                "group": name,
                "type": "group",
                "nodes": h.get("nodes", ""),
                "restricted": int(h.get("restricted", 0)),
                "nofailback": int(h.get("nofailback", 0)),
                "digest": config_digest(h),
            }
        )
    return out


@route("GET", "/cluster/replication")
def get_replication(ctx: Ctx) -> Any:
    return [dict(j) for j in ctx.rt.cluster.replication_jobs if ctx.can(f"/vms/{j['guest']}", "VM.Audit")]
