"""Mutating endpoints: each returns a UPID and changes state when its task finishes.

Where PVE checks a precondition before forking the worker, we raise a 500 at
once; where the check happens inside the worker (locks, "already running" for
QEMU), the UPID comes back and the task ends with that error as exitstatus.
"""

from __future__ import annotations

import re
import time
from typing import Any

from gateway.sim import disks
from gateway.sim import scenario as sc
from gateway.sim.errors import ApiError, perm_denied
from gateway.sim.handlers_read import config_digest
from gateway.sim.routes import Ctx, both, kind_of, route
from gateway.sim.schema import BOOL_TRUE
from gateway.sim.state import Guest, Snapshot, Volume
from gateway.sim.tags import split_tags

MiB = 1 << 20
GiB = 1 << 30


def _word(g: Guest) -> str:
    return "VM" if g.type == "qemu" else "CT"


def _prefix(g: Guest) -> str:
    return "qm" if g.type == "qemu" else "vz"


def check_lock(g: Guest) -> None:
    if g.lock:
        raise ApiError(500, f"{_word(g)} is locked ({g.lock})")


def _start_task(ctx: Ctx, g: Guest, wtype: str, work: Any, begin: Any = None, wid: str | None = None) -> str:
    task = ctx.rt.tasks.start(g.node, wtype, wid if wid is not None else str(g.vmid), ctx.user, work, begin=begin)
    return task.upid


# ---- power -------------------------------------------------------------------


def _set_running(g: Guest) -> None:
    disks.apply_pending(g)  # a (re)start picks up the pending changes
    sync_from_config(g)
    g.status = "running"
    g.started_at = time.time()
    g.pid = 10000 + (g.vmid * 7 + int(g.started_at)) % 900000


def _set_stopped(g: Guest) -> None:
    g.status = "stopped"
    g.started_at = 0.0
    g.pid = 0


def _power(ctx: Ctx, action: str) -> Any:
    kind = kind_of(ctx.path)
    g = ctx.guest(kind)
    w = _word(g)
    running = g.status != "stopped"
    cl = ctx.rt.cluster
    if g.template and action == "start":
        raise ApiError(500, f"you can't start a {w.lower()} if it's a template")
    # synchronous checks (done in the API handler before fork_worker)
    if kind == "lxc":
        if action == "start" and running:
            raise ApiError(500, f"CT {g.vmid} already running")
        if action in ("stop", "shutdown", "reboot", "suspend", "resume") and not running:
            raise ApiError(500, f"CT {g.vmid} not running")
    else:
        if action in ("suspend", "reboot", "resume") and not running:
            raise ApiError(500, f"VM {g.vmid} not running")
        if action in ("shutdown", "reboot") and g.status == "paused" and not ctx.params.get("forceStop"):
            raise ApiError(500, "VM is paused - cannot shutdown")
    if g.ha and action in ("start", "stop", "shutdown") and g.node:
        # HA-managed: the API only changes the request state; the LRM acts later
        target = "started" if action == "start" else "stopped"

        def ha_work() -> list[str]:
            assert g.ha is not None
            g.ha["state"] = target
            if target == "started" and g.status == "stopped":
                _set_running(g)
            elif target == "stopped" and g.status != "stopped":
                _set_stopped(g)
            cl.touch()
            return [f"Requesting HA {'start' if target == 'started' else 'stop'} for {w} {g.vmid}"]

        return _start_task(ctx, g, "hastart" if target == "started" else "hastop", ha_work)

    def begin() -> None:
        check_lock(g)
        if kind == "qemu" and action == "start" and g.status != "stopped":
            raise ApiError(500, f"VM {g.vmid} already running")

    def work() -> list[str]:
        if action == "start":
            _set_running(g)
        elif action in ("stop", "shutdown"):
            if g.status != "stopped":
                _set_stopped(g)
        elif action == "reboot":
            _set_running(g)
        elif action == "suspend":
            g.status = "paused"
        elif action == "resume":
            g.status = "running"
        cl.touch()
        return []

    wtype = {
        "start": "start",
        "stop": "stop",
        "shutdown": "shutdown",
        "reboot": "reboot",
        "suspend": "suspend",
        "resume": "resume",
    }[action]
    if kind == "qemu" and action == "suspend" and not ctx.params.get("todisk"):
        wtype = "pause"
    return _start_task(ctx, g, _prefix(g) + wtype, work, begin)


for _action in ("start", "stop", "shutdown", "reboot", "suspend", "resume"):

    def _make(action: str) -> Any:
        def handler(ctx: Ctx) -> Any:
            return _power(ctx, action)

        handler.__name__ = f"post_{action}"
        return handler

    both("POST", "/nodes/{node}/{kind}/{vmid}/status/" + _action)(_make(_action))


# ---- snapshots ---------------------------------------------------------------


@both("POST", "/nodes/{node}/{kind}/{vmid}/snapshot")
def post_snapshot(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    name = str(ctx.params["snapname"])
    if name == "current":
        raise ApiError(500, "unable to use snapshot name 'current' (reserved name)")
    if ctx.params.get("vmstate") and g.type == "lxc":
        raise ApiError(400, "Parameter verification failed.", {"vmstate": "property is not defined in schema"})

    def begin() -> list[str]:
        check_lock(g)
        if any(s.name == name for s in g.snapshots):
            raise ApiError(500, f"snapshot name '{name}' already used")
        g.lock = "snapshot"
        return [f"snapshotting '{name}'"] if g.type == "qemu" else []

    def work() -> list[str]:
        g.lock = None
        parent = g.snapshots[-1].name if g.snapshots else None
        vmstate = bool(ctx.params.get("vmstate")) and g.status == "running"
        g.snapshots.append(
            Snapshot(
                name=name,
                snaptime=int(time.time()),
                description=str(ctx.params.get("description", "")),
                vmstate=vmstate,
                parent=parent,
                config=dict(g.config),
            )
        )
        return [f"snapshot '{name}' created"]

    return _start_task(ctx, g, _prefix(g) + "snapshot", work, begin)


def _snap(g: Guest, name: str) -> Snapshot:
    s = next((s for s in g.snapshots if s.name == name), None)
    if s is None:
        raise ApiError(500, f"snapshot '{name}' does not exist")
    return s


@both("DELETE", "/nodes/{node}/{kind}/{vmid}/snapshot/{snapname}")
def delete_snapshot(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    name = str(ctx.params["snapname"])

    def begin() -> None:
        if not ctx.params.get("force"):
            check_lock(g)
        _snap(g, name)
        g.lock = "snapshot-delete"

    def work() -> list[str]:
        g.lock = None
        snap = _snap(g, name)
        for s in g.snapshots:
            if s.parent == name:
                s.parent = snap.parent
        g.snapshots.remove(snap)
        return []

    return _start_task(ctx, g, _prefix(g) + "delsnapshot", work, begin)


@both("POST", "/nodes/{node}/{kind}/{vmid}/snapshot/{snapname}/rollback")
def post_rollback(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    name = str(ctx.params["snapname"])

    def begin() -> None:
        check_lock(g)
        _snap(g, name)
        g.lock = "rollback"

    def work() -> list[str]:
        g.lock = None
        snap = _snap(g, name)
        g.config = dict(snap.config)
        sync_from_config(g)
        # PVE keeps later snapshots; only the "current" pointer moves (not modelled further)
        if snap.vmstate:
            _set_running(g)
        else:
            _set_stopped(g)
            if ctx.params.get("start"):
                _set_running(g)
        return []

    return _start_task(ctx, g, _prefix(g) + "rollback", work, begin)


# ---- config ------------------------------------------------------------------


def agent_enabled(value: Any) -> bool:
    """QEMU `agent` is a property string whose default key is `enabled`, a PVE boolean: a bare item
    (anywhere: parse_property_string gives any part without `=` to the default key) or `enabled=`,
    written 1/yes/on/true in any case ("true", "fstrim_cloned_disks=1,enabled=yes")."""
    if value is None:
        return False
    enabled = "0"
    for part in str(value).split(","):
        key, eq, val = part.strip().partition("=")
        if not eq and key:
            enabled = key
        elif key == "enabled":
            enabled = val
    return enabled.lower() in BOOL_TRUE


def sync_from_config(g: Guest) -> None:
    """Keep derived fields (name, tags, sizes) in step with the config."""
    cfg = g.config
    g.name = str(cfg.get("name" if g.type == "qemu" else "hostname", g.name))
    g.tags = split_tags(cfg.get("tags"))
    if "cores" in cfg:
        g.cpus = int(cfg["cores"]) * int(cfg.get("sockets", 1))
    if "memory" in cfg:
        g.maxmem = int(str(cfg["memory"]).split(",")[0].replace("current=", "")) * MiB
    g.agent = agent_enabled(cfg.get("agent"))
    g.template = bool(int(cfg.get("template", 0)))


def skiplock_of(ctx: Ctx) -> bool:
    """`skiplock` is for root@pam alone; an API token (even root@pam's) is refused with a 400."""
    if not ctx.params.get("skiplock"):
        return False
    if ctx.user != "root@pam":
        raise ApiError(400, "Parameter verification failed.", {"skiplock": "Only root may use this option."})
    return True


def _config_options(ctx: Ctx, g: Guest) -> set[str]:
    """The options the guest's config schema knows (PVE's option_exists): `delete` names only these."""
    ep = ctx.rt.schema.by_template.get(("PUT", f"/nodes/{{node}}/{g.type}/{{vmid}}/config"))
    props = ep.params if ep is not None else {}
    meta = {"node", "vmid", "delete", "revert", "digest", "skiplock", "force", "background_delay"}
    return _Options({k for k in props if k not in meta})


class _Options(set[str]):
    """Option names, with `net[n]` standing for net0, net1, ..."""

    def __contains__(self, key: object) -> bool:
        if super().__contains__(key):
            return True
        m = re.fullmatch(r"([a-z_-]+?)(\d+)", str(key))
        return m is not None and super().__contains__(f"{m.group(1)}[n]")


def _update_config(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    p = dict(ctx.params)
    for k in ("node", "vmid"):
        p.pop(k, None)
    digest = p.pop("digest", None)
    skiplock = skiplock_of(ctx)
    p.pop("skiplock", None)
    deletes = [d for d in str(p.pop("delete", "")).replace(";", ",").split(",") if d]
    reverts = [r for r in str(p.pop("revert", "")).split(",") if r]
    p.pop("force", None)
    p.pop("background_delay", None)
    # update_vm_api / update_pct_config check the lists before anything else: a client's mistake is a 400
    options = _config_options(ctx, g)
    for k in deletes:
        if k in p:
            raise ApiError(
                400,
                "Parameter verification failed.",
                {"delete": f"you can't use '-{k}' and -delete {k}' at the same time"},
            )
        if k not in options:
            raise ApiError(400, "Parameter verification failed.", {"delete": f"unknown option '{k}'"})
    for k in reverts:
        if k in p or k in deletes:
            raise ApiError(
                400,
                "Parameter verification failed.",
                {"revert": f"you can't use '-{k}' and '-revert {k}' at the same time"},
            )
    if digest and digest != config_digest(g.config):
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
    if g.lock and not skiplock:
        check_lock(g)
    for k in deletes:
        disks.delete_key(ctx.rt.cluster, g, k)
    for k in reverts:
        g.pending.pop(k, None)
    for k, v in p.items():
        disks.set_key(ctx.rt.cluster, g, k, v)
    sync_from_config(g)
    ctx.rt.cluster.touch()
    return None


@route("PUT", "/nodes/{node}/qemu/{vmid}/config")
def put_qemu_config(ctx: Ctx) -> Any:
    return _update_config(ctx)


@route("PUT", "/nodes/{node}/lxc/{vmid}/config")
def put_lxc_config(ctx: Ctx) -> Any:
    return _update_config(ctx)


@route("POST", "/nodes/{node}/qemu/{vmid}/config")
def post_qemu_config(ctx: Ctx) -> Any:
    """The async variant: applies like PUT, but inside a `qmconfig` worker."""
    g = ctx.guest("qemu")
    digest = ctx.params.get("digest")
    if digest and digest != config_digest(g.config):
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
    check_lock(g)

    def work() -> list[str]:
        _update_config(ctx)
        return []

    return _start_task(ctx, g, "qmconfig", work)


# ---- delete ------------------------------------------------------------------


@both("DELETE", "/nodes/{node}/{kind}/{vmid}")
def delete_guest(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cl = ctx.rt.cluster
    w = _word(g)
    if int(g.config.get("protection", 0)):
        raise ApiError(500, f"can't remove {w} {g.vmid} - protection mode enabled")
    if g.status != "stopped" and not (g.type == "lxc" and ctx.params.get("force")):
        raise ApiError(500, f"{w} {g.vmid} is running - destroy failed")
    if g.ha and not ctx.params.get("purge"):
        raise ApiError(500, f"unable to remove {w} {g.vmid} - used in HA resources and purge parameter not set.")
    if not skiplock_of(ctx):
        check_lock(g)

    def begin() -> None:
        g.lock = "destroyed"

    def work() -> list[str]:
        cl.guests.pop(g.vmid, None)
        cl.volumes[:] = [v for v in cl.volumes if not (v.vmid == g.vmid and v.content in ("images", "rootdir"))]
        cl.guest_firewall_rules.pop(g.vmid, None)
        if ctx.params.get("purge"):
            for j in cl.backup_jobs:
                ids = [x for x in str(j.get("vmid", "")).split(",") if x and x != str(g.vmid)]
                if "vmid" in j:
                    j["vmid"] = ",".join(ids)
        return ["Removing image: 100% complete...done."]

    return _start_task(ctx, g, _prefix(g) + "destroy", work, begin)


# ---- migrate / clone -----------------------------------------------------------


@both("POST", "/nodes/{node}/{kind}/{vmid}/migrate")
def post_migrate(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cl = ctx.rt.cluster
    target = str(ctx.params["target"])
    if target == g.node:
        raise ApiError(500, "target is local node.")
    if target not in cl.nodes:
        raise ApiError(500, f"no such cluster node '{target}'")
    if not ctx.rt.node_online(target):
        raise ApiError(500, f"target node '{target}' is not online")
    running = g.status != "stopped"
    if running and g.type == "qemu" and not ctx.params.get("online"):
        raise ApiError(500, "can't migrate running VM without --online")
    if running and g.type == "lxc" and not ctx.params.get("restart") and not ctx.params.get("online"):
        raise ApiError(500, "CT is running - use 'restart' or 'online' migration")
    if running and g.type == "lxc" and ctx.params.get("online"):
        raise ApiError(500, "lxc live migration is currently not implemented")
    local_disk = any(
        v.vmid == g.vmid and v.content in ("images", "rootdir") and not cl.storages[v.storage].shared
        for v in cl.volumes
    )
    if running and g.type == "qemu" and local_disk and not ctx.params.get("with-local-disks"):
        raise ApiError(500, "can't live migrate attached local disks without with-local-disks option")

    def begin() -> list[str]:
        check_lock(g)
        g.lock = "migrate"
        return [f"starting migration of {_word(g)} {g.vmid} to node '{target}' ({cl.nodes[target].ip})"]

    def work() -> list[str]:
        g.lock = None
        g.node = target
        for v in cl.volumes:
            if v.vmid == g.vmid and v.node is not None and v.content in ("images", "rootdir"):
                v.node = target
        if g.type == "lxc" and running:
            _set_running(g)
        cl.touch()
        return ["migration finished successfully (duration 00:00:01)"]

    if g.ha:

        def ha_work() -> list[str]:
            return work()

        return _start_task(ctx, g, "hamigrate", ha_work)
    return _start_task(ctx, g, "qmigrate" if g.type == "qemu" else "vzmigrate", work, begin)


@both("POST", "/nodes/{node}/{kind}/{vmid}/clone")
def post_clone(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cl = ctx.rt.cluster
    newid = int(ctx.params["newid"])
    if newid in cl.guests:
        raise ApiError(500, f"VM {newid} already exists")
    target = str(ctx.params.get("target", g.node))
    if target not in cl.nodes or not ctx.rt.node_online(target):
        raise ApiError(500, f"target node '{target}' is not online")
    pool = ctx.params.get("pool")
    if pool and pool not in cl.pools:
        raise ApiError(500, f"pool '{pool}' does not exist")
    snapname = ctx.params.get("snapname")
    if snapname:
        _snap(g, str(snapname))
    full = ctx.params.get("full", 0 if g.template else 1)
    if not full and not g.template:
        raise ApiError(500, "Linked clone feature is not supported for drive 'scsi0'")
    storage = ctx.params.get("storage")
    if storage:
        ctx.require(f"/storage/{storage}", "Datastore.AllocateSpace")
    name_key = "name" if g.type == "qemu" else "hostname"
    new_name = str(ctx.params.get(name_key, f"Copy-of-VM-{g.name}" if g.type == "qemu" else g.name))
    cfg = dict(g.config)
    cfg[name_key] = new_name
    cfg.pop("template", None)
    if ctx.params.get("description"):
        cfg["description"] = ctx.params["description"]
    clone = Guest(
        vmid=newid,
        type=g.type,
        node=target,
        name=new_name,
        status="stopped",
        tags=list(g.tags),
        pool=str(pool) if pool else None,
        config=cfg,
        lock="create",
        cpus=g.cpus,
        maxmem=g.maxmem,
        maxdisk=g.maxdisk,
        agent=g.agent,
        interfaces=[dict(i) for i in g.interfaces],
        docker=None if g.docker is None else [],
    )
    disk_key = "scsi0" if g.type == "qemu" else "rootfs"

    def begin() -> list[str]:
        check_lock(g)
        cl.guests[newid] = clone  # the new config exists (locked) while the copy runs
        return [f"create {'full' if full else 'linked'} clone of drive {disk_key} ({cfg.get(disk_key, '')})"]

    def work() -> list[str]:
        clone.lock = None
        line = str(cfg.get(disk_key, ""))
        if ":" in line:
            store = str(storage or line.split(":", 1)[0])
            vol = f"vm-{newid}-disk-0"
            size = line.split("size=")[-1] if "size=" in line else f"{g.maxdisk // GiB}G"
            clone.config[disk_key] = f"{store}:{vol},size={size}"
            if store in cl.storages:
                cl.volumes.append(
                    Volume(
                        storage=store,
                        volid=f"{store}:{vol}",
                        format="raw",
                        content="images" if g.type == "qemu" else "rootdir",
                        size=g.maxdisk,
                        node=None if cl.storages[store].shared else target,
                        vmid=newid,
                        ctime=int(time.time()),
                    )
                )
        return []

    def finish(ok: bool) -> None:
        if not ok:
            cl.guests.pop(newid, None)

    task = ctx.rt.tasks.start(
        g.node, "qmclone" if g.type == "qemu" else "vzclone", str(g.vmid), ctx.user, work, begin=begin, on_finish=finish
    )
    return task.upid


# ---- backup --------------------------------------------------------------------


@route("POST", "/nodes/{node}/vzdump")
def post_vzdump(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    p = ctx.params
    if p.get("all"):
        vmids = [g.vmid for g in cl.guests.values() if g.node == node]
    elif p.get("pool"):
        vmids = [g.vmid for g in cl.guests.values() if g.pool == p["pool"] and g.node == node]
    elif p.get("vmid"):
        vmids = [int(x) for x in str(p["vmid"]).replace(";", ",").split(",") if x.strip()]
    else:
        raise ApiError(400, "Parameter verification failed.", {"vmid": "property is missing and it is not optional"})
    # VZDump.pm: a guest on another node is that node's to back up; with none selected here (and no
    # --all) it exits silently, before its storage and guest checks: "OK", no task. An unknown vmid
    # stays in the selection (refused below; real PVE lets its task fail on it)
    if not p.get("all") and all(v in cl.guests and cl.guests[v].node != node for v in vmids):
        return "OK"
    storage = str(p.get("storage", "local"))
    st = cl.storages.get(storage)
    if st is None:
        raise ApiError(500, f"storage '{storage}' does not exist")
    if "backup" not in st.content:
        raise ApiError(500, f"storage '{storage}' does not support backups")
    # vzdump is user:all in the schema; the checks are in VZDump.pm
    for vmid in vmids:
        if not ctx.can(f"/vms/{vmid}", "VM.Backup"):
            raise perm_denied(f"/vms/{vmid}", "VM.Backup")
    ctx.require(f"/storage/{storage}", "Datastore.AllocateSpace")
    for vmid in vmids:
        if vmid not in cl.guests:
            raise ApiError(500, f"unable to find VM '{vmid}'")
    local = [cl.guests[v] for v in vmids if cl.guests[v].node == node]
    mode = str(p.get("mode", "snapshot"))
    notes_tpl = p.get("notes-template")
    protected = bool(p.get("protected"))
    locked: list[Guest] = []

    def begin() -> list[str]:
        lines = [
            f"INFO: starting new backup job: vzdump {' '.join(str(v) for v in vmids)} --storage {storage} --mode {mode}"
        ]
        for g in local:
            if g.lock:
                lines.append(f"ERROR: Backup of VM {g.vmid} failed - {_word(g)} is locked ({g.lock})")
                continue
            g.lock = "backup"
            locked.append(g)
        return lines

    def work() -> list[str]:
        lines: list[str] = []
        if not st.active:
            for g in locked:
                g.lock = None
            raise ApiError(500, f"storage '{storage}' is not online")
        now = int(time.time())
        failed = len(local) - len(locked)
        for g in locked:
            g.lock = None
            notes = None
            if notes_tpl:
                notes = (
                    str(notes_tpl)
                    .replace("{{guestname}}", g.name)
                    .replace("{{vmid}}", str(g.vmid))
                    .replace("{{node}}", g.node)
                    .replace("{{cluster}}", cl.name)
                )
            vol = sc._backup_volume(
                cl,
                {
                    "storage": storage,
                    "vmid": g.vmid,
                    "age_hours": 0,
                    "size_mb": max(64, g.maxdisk // MiB // 20),
                    "node": g.node,
                },
                now,
            )
            vol.notes = notes
            vol.protected = protected
            vol.config = dict(g.config)
            cl.volumes.append(vol)
            lines.append(f"INFO: Starting Backup of VM {g.vmid} ({g.type})")
            lines.append(f"INFO: creating vzdump archive '{vol.volid}'")
            lines.append(f"INFO: Finished Backup of VM {g.vmid} (00:00:01)")
        lines.append(
            "INFO: Backup job finished successfully" if not failed else "INFO: Backup job finished with errors"
        )
        if failed:
            raise ApiError(500, "job errors")
        return lines

    wid = str(vmids[0]) if len(vmids) == 1 else ""
    task = ctx.rt.tasks.start(node, "vzdump", wid, ctx.user, work, begin=begin)
    return task.upid
