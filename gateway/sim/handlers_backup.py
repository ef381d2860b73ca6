"""Backup restore, pruning, backup jobs and calendar events, as PVE does them.

A backup volume carries the guest configuration it was taken from (`Volume.config`),
so a restore recreates that guest, and GET /nodes/{node}/vzdump/extractconfig answers it
as the archive's config file holds it; pruning marks backups with PVE's algorithm
(PVE::Storage::prune_mark_backup_group); schedules are a subset of systemd-like
calendar events ("02:00", "sat 03:00", "mon..fri 22:30", "*/15"), evaluated in UTC.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.sim import disks
from gateway.sim.errors import ApiError
from gateway.sim.handlers_read import _storage_on
from gateway.sim.handlers_write import _set_running, check_lock, sync_from_config
from gateway.sim.routes import Ctx, route
from gateway.sim.state import Cluster, Guest, Volume

GiB = disks.GiB

# ---- restore ---------------------------------------------------------------------


def backup_volume(cl: Cluster, volid: str, kind: str) -> Volume:
    vol = next((v for v in cl.volumes if v.volid == volid and v.content == "backup"), None)
    if vol is None:
        raise ApiError(500, f"volume '{volid}' does not exist")
    if (vol.subtype or "qemu") != kind:
        raise ApiError(500, f"{volid}: not a {'VM' if kind == 'qemu' else 'container'} backup")
    return vol


def stored_config(vol: Volume, kind: str, vmid: int) -> dict[str, Any]:
    """The guest configuration a backup holds (a scenario's backup of a guest it does not
    define holds a minimal one, named after `vmid`)."""
    return dict(vol.config or {"name" if kind == "qemu" else "hostname": f"restored-{vmid}", "cores": 1})


def _encode_text(line: str) -> str:
    """PVE::Tools::encode_text: control and non-ASCII characters and ':' percent-encoded."""
    return "".join(c if " " <= c <= "~" and c != ":" else "".join(f"%{b:02X}" for b in c.encode()) for c in line)


def config_file(config: dict[str, Any]) -> str:
    """A guest configuration as its file holds it (write_vm_config, write_pct_config): the
    description as `#` lines first, then every setting, sorted by key."""
    lines: list[str] = []
    if "description" in config:
        descr = str(config["description"])
        lines += ["#" + _encode_text(x) for x in descr.split("\n")] if descr else ["#"]
    lines += [f"{k}: {v}" for k, v in sorted(config.items()) if k not in ("description", "digest", "lock", "parent")]
    return "".join(f"{x}\n" for x in lines)


def archived_config(vol: Volume, kind: str) -> str:
    """The config file inside a backup, as vzdump wrote it: a VM's without its unused disks and
    followed by one `#qmdump#map:` line per disk in the archive (VZDump::QemuServer assemble);
    a container's as it was (VZDump::LXC: lock and snapshots dropped)."""
    config = stored_config(vol, kind, vol.vmid or 0)
    if kind != "qemu":
        return config_file(config)
    config = {k: v for k, v in config.items() if not k.startswith("unused")}
    maps = ""
    for key, line in sorted(config.items()):
        volid = disks.volid_of(str(line)) if disks.is_disk(kind, key) else None
        if volid and "media=cdrom" not in str(line) and not re.search(r"(^|,)backup=(0|no)(,|$)", str(line)):
            fmt = "qcow2" if volid.endswith(".qcow2") else "raw"
            maps += f"#qmdump#map:{key}:drive-{key}:{volid.split(':', 1)[0]}:{fmt}:\n"
    return config_file(config) + maps


_OWNER = re.compile(r"^backup/(?:vzdump-(?:qemu|lxc|openvz)-|(?:vm|ct)/)([1-9][0-9]{2,8})[-/]")


# what PVE::VZDump::read_vzdump_defaults starts from (the vzdump schema's defaults)
VZDUMP_DEFAULTS: dict[str, Any] = {
    "mode": "snapshot", "compress": "0", "remove": 1, "ionice": 7, "lockwait": 180, "stopwait": 10,
    "bwlimit": 0, "pigz": 0, "zstd": 1, "stdexcludes": 1, "mailnotification": "always",
}  # fmt: skip


def print_keep(keep: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in keep.items())


@route("GET", "/nodes/{node}/vzdump/defaults")
def get_vzdump_defaults(ctx: Ctx) -> Any:
    """The vzdump options a backup on this node runs with (pve-manager API2/VZDump.pm `defaults`):
    the node's /etc/vzdump.conf over the schema's defaults, its legacy `maxfiles` read as
    keep-last (0: keep-all, PVE::VZDump parse_prune_backups_maxfiles), then the storage's own
    retention over it when the storage sets one; `prune-backups` printed back as a property string.
    A job or backup without a retention of its own prunes by this one."""
    node = ctx.rt.cluster.nodes[str(ctx.params["node"])]
    conf = dict(node.vzdump_conf)
    res: dict[str, Any] = {**VZDUMP_DEFAULTS, **{k: v for k, v in conf.items() if k != "maxfiles"}}
    if conf.get("prune-backups") in (None, ""):
        maxfiles = conf.get("maxfiles")
        res["prune-backups"] = "keep-all=1" if maxfiles is None or int(maxfiles) == 0 else f"keep-last={int(maxfiles)}"
    storage = str(ctx.params.get("storage") or res.get("storage") or "local")
    res["storage"] = storage
    ctx.require(f"/storage/{storage}", "Datastore.Audit", "Datastore.AllocateSpace", any_of=True)
    st = ctx.rt.cluster.storages.get(storage)
    if st is None:
        raise ApiError(500, f"storage '{storage}' does not exist")
    if "backup" not in st.content:
        raise ApiError(500, f"can't use storage '{storage}' for backups - wrong content type")
    if st.extra.get("prune-backups") not in (None, ""):
        res["prune-backups"] = str(st.extra["prune-backups"])
    res["prune-backups"] = print_keep(parse_keep(str(res["prune-backups"])))
    return res


@route("GET", "/nodes/{node}/vzdump/extractconfig")
def get_extractconfig(ctx: Ctx) -> Any:
    """The configuration a backup holds, as text (PVE::API2::VZDump extractconfig: check_volume_access,
    VM.Backup on the backed-up guest, then PVE::Storage::extract_vzdump_config on this node)."""
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    volid = str(ctx.params["volume"])
    sid, sep, volname = volid.partition(":")
    if not sep or not re.match(r"^[a-z][a-z0-9._-]*[a-z0-9]$", sid):
        raise ApiError(500, "Only root can pass arbitrary filesystem paths.")
    st = cl.storages.get(sid)
    if st is None:
        raise ApiError(500, f"storage '{sid}' does not exist")
    m = _OWNER.match(volname)
    owner = int(m.group(1)) if m else None
    vtype = volname.split("/", 1)[0] if volname.split("/", 1)[0] in ("backup", "iso", "vztmpl", "import") else "images"
    if not ctx.can(f"/storage/{sid}", "Datastore.Allocate"):  # check_volume_access
        if vtype in ("iso", "vztmpl", "import"):
            ctx.require(f"/storage/{sid}", "Datastore.AllocateSpace", "Datastore.Audit", any_of=True)
        elif vtype == "backup" and owner is not None:
            ctx.require(f"/storage/{sid}", "Datastore.AllocateSpace")
            ctx.require(f"/vms/{owner}", "VM.Backup")
        else:
            raise ApiError(500, f"missing privileges to access {volid}")
    if owner is not None:
        ctx.require(f"/vms/{owner}", "VM.Backup")
    _storage_on(ctx, sid, node)
    if not st.active:
        raise ApiError(500, f"storage '{sid}' is not online")
    vol = next((v for v in cl.volumes if v.volid == volid and v.content == "backup" and v.node in (None, node)), None)
    if vol is None:
        if st.type == "pbs":
            raise ApiError(500, f"proxmox-backup-client failed: Error: unable to find snapshot '{volname[7:]}'")
        if vtype != "backup":
            raise ApiError(500, f"ERROR: couldn't determine archive info from '{volid}'")
        raise ApiError(500, f"can't find file '{volid}'")
    return archived_config(vol, vol.subtype or "qemu")


def restore(ctx: Ctx, kind: str) -> Any:
    """POST /nodes/{node}/qemu with archive=, or /lxc with restore=1: a create from a backup."""
    cl = ctx.rt.cluster
    p = ctx.params
    node = str(p["node"])
    vmid = int(p["vmid"])
    volid = str(p["archive"] if kind == "qemu" else p["ostemplate"])
    vol = backup_volume(cl, volid, kind)
    existing = cl.guests.get(vmid)
    word = "VM" if kind == "qemu" else "CT"
    if existing is not None:
        if not p.get("force"):
            raise ApiError(
                500, f"unable to restore {word} {vmid} - {word} {vmid} already exists on node '{existing.node}'"
            )
        if existing.node != node or existing.type != kind:
            raise ApiError(500, f"unable to restore {word} {vmid} - {word} {vmid} exists on node '{existing.node}'")
        if existing.status != "stopped":
            raise ApiError(500, f"unable to restore {word} {vmid} - {word} is running")
        if int(existing.config.get("protection", 0)):
            raise ApiError(500, f"unable to restore {word} {vmid} - protection mode enabled")
        check_lock(existing)
        ctx.require(f"/vms/{vmid}", "VM.Backup")
    else:
        pool = p.get("pool")
        if not (ctx.can(f"/vms/{vmid}", "VM.Allocate") or (pool and ctx.can(f"/pool/{pool}", "VM.Allocate"))):
            ctx.require(f"/vms/{vmid}", "VM.Allocate")
        if pool and pool not in cl.pools:
            raise ApiError(500, f"pool '{pool}' does not exist")
    storage = p.get("storage")
    if storage:
        if storage not in cl.storages:
            raise ApiError(500, f"storage '{storage}' does not exist")
        ctx.require(f"/storage/{storage}", "Datastore.AllocateSpace")
    source = stored_config(vol, kind, vmid)
    g = existing or Guest(vmid=vmid, type=kind, node=node, name="", pool=str(p["pool"]) if p.get("pool") else None)  # type: ignore[arg-type]

    def begin() -> list[str]:
        g.lock = "create"
        cl.guests[vmid] = g
        return [
            f"restore vma archive: {volid}" if kind == "qemu" else f"recovering backed-up configuration from '{volid}'"
        ]

    def work() -> list[str]:
        lines: list[str] = []
        for v in [v for v in cl.volumes if v.vmid == vmid and v.content in ("images", "rootdir")]:
            disks.free_volume(cl, v.volid)  # in place: the current disks are destroyed
        g.config = {}
        g.pending.clear()
        for key, line in source.items():
            volid_old = (
                disks.volid_of(str(line)) if disks.is_disk(kind, key) and "media=cdrom" not in str(line) else None
            )
            if volid_old:
                target = str(storage or volid_old.split(":", 1)[0])
                size = max(1, disks.size_of(str(line)) // GiB)
                rest = ",".join(x for x in str(line).split(",")[1:] if not x.startswith("size="))
                g.config[key] = disks.allocate(cl, g, key, f"{target}:{size}" + (f",{rest}" if rest else ""))
                lines.append(f"new volume '{disks.volid_of(g.config[key])}' for {key}")
            elif key.startswith("unused"):
                continue
            elif key.startswith("net") and kind == "qemu" and p.get("unique"):  # a new MAC address
                g.config[key] = disks.with_mac(g, key, re.sub(r"^([a-z0-9]+)=[0-9A-Fa-f:]{17}", r"\1", str(line)))
            else:
                g.config[key] = line
        if kind == "lxc" and p.get("unprivileged") is not None:  # the call's setting wins over the backup's
            g.config["unprivileged"] = int(p["unprivileged"])
        root = "scsi0" if kind == "qemu" else "rootfs"
        g.maxdisk = disks.size_of(str(g.config.get(root, "")))
        sync_from_config(g)
        g.lock = None
        if p.get("start"):
            _set_running(g)
        cl.touch()
        return lines

    def finish(ok: bool) -> None:
        if not ok and existing is None:
            cl.guests.pop(vmid, None)

    task = ctx.rt.tasks.start(
        node, "qmrestore" if kind == "qemu" else "vzrestore", str(vmid), ctx.user, work, begin=begin, on_finish=finish
    )
    return task.upid


# ---- prune -----------------------------------------------------------------------

KEEP_KEYS: list[tuple[str, Callable[[int], str]]] = [
    ("keep-last", lambda t: str(t)),
    ("keep-hourly", lambda t: time.strftime("%Y/%m/%d/%H", time.gmtime(t))),
    ("keep-daily", lambda t: time.strftime("%Y/%m/%d", time.gmtime(t))),
    ("keep-weekly", lambda t: time.strftime("%G/%V", time.gmtime(t))),
    ("keep-monthly", lambda t: time.strftime("%Y/%m", time.gmtime(t))),
    ("keep-yearly", lambda t: time.strftime("%Y", time.gmtime(t))),
]


def parse_keep(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in spec.split(","):
        k, _, v = part.partition("=")
        if k not in {"keep-all", *(key for key, _ in KEEP_KEYS)} or not v.isdigit():
            raise ApiError(400, "Parameter verification failed.", {"prune-backups": f"invalid format - '{part}'"})
        out[k] = int(v)
    return out


def prune_marks(cl: Cluster, storage: str, node: str, keep: dict[str, int], vmid: int | None) -> list[dict[str, Any]]:
    vols = [
        v
        for v in cl.volumes
        if v.storage == storage
        and v.content == "backup"
        and (v.node in (None, node))
        and (vmid is None or v.vmid == vmid)
    ]
    entries: list[dict[str, Any]] = []
    for group in sorted({(v.subtype or "qemu", v.vmid) for v in vols}, key=lambda x: (x[1] or 0, x[0])):
        members = sorted(
            (v for v in vols if (v.subtype or "qemu", v.vmid) == group), key=lambda v: v.ctime or 0, reverse=True
        )
        rows = [
            {"volid": v.volid, "vmid": v.vmid, "type": v.subtype or "qemu", "ctime": v.ctime or 0,
             "mark": "protected" if v.protected else None}
            for v in members
        ]  # fmt: skip
        if keep.get("keep-all") or not any(keep.get(k) for k, _ in KEEP_KEYS):
            for r in rows:
                r["mark"] = r["mark"] or "keep"
        else:
            for key, id_of in KEEP_KEYS:
                _mark(rows, keep.get(key, 0), id_of)
            for r in rows:
                r["mark"] = r["mark"] or "remove"
        entries.extend(rows)
    return entries


def _mark(rows: list[dict[str, Any]], count: int, id_of: Callable[[int], str]) -> None:
    """One keep-* option over a group, newest first (PVE's $prune_mark)."""
    if not count:
        return
    already = {id_of(r["ctime"]) for r in rows if r["mark"] == "keep"}
    new: set[str] = set()
    for r in rows:
        rid = id_of(r["ctime"])
        if r["mark"] is not None or rid in already:
            continue
        if rid not in new:
            if len(new) >= count:
                break
            new.add(rid)
            r["mark"] = "keep"
        else:
            r["mark"] = "remove"


def _prune_args(ctx: Ctx) -> tuple[str, str, dict[str, int], int | None]:
    cl = ctx.rt.cluster
    storage = str(ctx.params["storage"])
    st = cl.storages.get(storage)
    if st is None:
        raise ApiError(500, f"storage '{storage}' does not exist")
    if "backup" not in st.content:
        raise ApiError(500, f"storage '{storage}' does not support backups")
    spec = ctx.params.get("prune-backups") or st.extra.get("prune-backups") or "keep-all=1"
    vmid = ctx.params.get("vmid")
    return storage, str(ctx.params["node"]), parse_keep(str(spec)), int(vmid) if vmid is not None else None


@route("GET", "/nodes/{node}/storage/{storage}/prunebackups")
def get_prunebackups(ctx: Ctx) -> Any:
    storage, node, keep, vmid = _prune_args(ctx)
    return prune_marks(ctx.rt.cluster, storage, node, keep, vmid)


@route("DELETE", "/nodes/{node}/storage/{storage}/prunebackups")
def delete_prunebackups(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    storage, node, keep, vmid = _prune_args(ctx)
    if vmid is not None:
        ctx.require(f"/vms/{vmid}", "VM.Backup")
        ctx.require(f"/storage/{storage}", "Datastore.AllocateSpace")
    else:
        ctx.require(f"/storage/{storage}", "Datastore.Allocate")

    def work() -> list[str]:
        lines = []
        for row in prune_marks(cl, storage, node, keep, vmid):
            if row["mark"] == "remove":
                disks.free_volume(cl, row["volid"])
                lines.append(f"removed '{row['volid']}'")
        cl.touch()
        return lines

    # PVE (PruneBackups.pm): fork_worker('prunebackups', (defined($vmid) ? "$vmid@" : '') . $storeid, ...)
    worker_id = f"{vmid}@{storage}" if vmid is not None else storage
    return ctx.rt.tasks.start(node, "prunebackups", worker_id, ctx.user, work).upid


# ---- calendar events ----------------------------------------------------------------

DOW = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
ALIASES = {"minutely": "*:*", "hourly": "*:00", "daily": "00:00", "weekly": "mon 00:00"}


def _values(spec: str, lo: int, hi: int, names: list[str] | None = None) -> set[int]:
    out: set[int] = set()
    for item in spec.split(","):
        base, _, step = item.partition("/")

        def num(s: str) -> int:
            if names and s in names:
                return names.index(s)
            if not s.isdigit():
                raise ValueError(s)
            return int(s)

        if base == "*":
            start, end = lo, hi
        elif ".." in base:
            a, b = base.split("..", 1)
            start, end = num(a), num(b)
        else:
            start = num(base)
            end = hi if step else start
        if not (lo <= start <= hi and lo <= end <= hi) or (step and not step.isdigit()):
            raise ValueError(item)
        out.update(range(start, end + 1, int(step) if step else 1))
    return out


def parse_event(spec: str) -> tuple[set[int], set[int], set[int]]:
    """(weekdays 0=Mon, hours, minutes) of a calendar event; ApiError when unparsable."""
    words = ALIASES.get(spec.strip(), spec.strip()).split()
    try:
        days = set(range(7))
        if words and words[0][0].isalpha():
            days = _values(words.pop(0), 0, 6, DOW)
        if len(words) != 1:
            raise ValueError(spec)
        clock = words[0]
        hour_spec, minute_spec = clock.split(":", 1) if ":" in clock else ("*", clock)
        return days, _values(hour_spec, 0, 23), _values(minute_spec, 0, 59)
    except ValueError:
        raise ApiError(
            400, "Parameter verification failed.", {"schedule": f"unable to parse calendar event - {spec}"}
        ) from None


def next_runs(spec: str, after: int, count: int) -> Iterator[int]:
    days, hours, minutes = parse_event(spec)
    day0 = after - after % 86400
    found = 0
    for d in range(0, 800):
        midnight = day0 + d * 86400
        if time.gmtime(midnight).tm_wday not in days:
            continue
        for h in sorted(hours):
            for m in sorted(minutes):
                t = midnight + h * 3600 + m * 60
                if t > after:
                    yield t
                    found += 1
                    if found >= count:
                        return


@route("GET", "/cluster/jobs/schedule-analyze")
def get_schedule_analyze(ctx: Ctx) -> Any:
    start = int(ctx.params.get("starttime") or time.time())
    count = int(ctx.params.get("iterations") or 10)
    return [
        {"timestamp": t, "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))}
        for t in next_runs(str(ctx.params["schedule"]), start, count)
    ]


# ---- backup jobs ----------------------------------------------------------------------

JOB_FIELDS = {"id", "type", "node"}

# pve-manager decodes these property strings when it reads jobs.cfg (PVE::VZDump::JobBase
# decode_value over $PVE::VZDump::Common::PROPERTY_STRINGS), so GET /cluster/backup and
# GET /cluster/backup/{id} answer them as objects: the 9.1 schema types `prune-backups`,
# `performance` and `fleecing` `object` ({"keep-last": 3}, never "keep-last=3")
JOB_OBJECTS = ("prune-backups", "performance", "fleecing")


def property_object(spec: Any) -> Any:
    """A property string (`keep-daily=7,keep-weekly=4`) as the object Proxmox decodes it into,
    numbers as numbers; a value already an object is kept."""
    if not isinstance(spec, str):
        return spec
    out: dict[str, Any] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq:  # a default key's value given bare (fleecing's `1`)
            key, value = "enabled", key
        out[key] = int(value) if value.isdigit() else value
    return out


def job_view(j: dict[str, Any], now: int) -> dict[str, Any]:
    d = dict(j)
    for key in JOB_OBJECTS:
        if d.get(key) not in (None, ""):
            d[key] = property_object(d[key])
    if int(d.get("enabled", 1)) and d.get("schedule"):
        d["next-run"] = next(next_runs(str(d["schedule"]), now, 1), None)
    return d


def _job(cl: Cluster, jid: str) -> dict[str, Any]:
    j = next((j for j in cl.backup_jobs if j.get("id") == jid), None)
    if j is None:
        raise ApiError(500, f"job '{jid}' does not exist")
    return j


def _check_selection(ctx: Ctx, job: dict[str, Any]) -> None:
    cl = ctx.rt.cluster
    chosen = [k for k in ("vmid", "pool", "all") if job.get(k) not in (None, "", 0)]
    if len(chosen) != 1:
        raise ApiError(
            400, "Parameter verification failed.", {"vmid": "you need to specify exactly one of vmid, pool or all"}
        )
    if job.get("pool") and job["pool"] not in cl.pools:
        raise ApiError(500, f"pool '{job['pool']}' does not exist")
    st = cl.storages.get(str(job.get("storage", "local")))
    if st is None or "backup" not in st.content:
        raise ApiError(500, f"storage '{job.get('storage')}' does not exist or does not support backups")
    if job.get("schedule"):
        parse_event(str(job["schedule"]))


@route("POST", "/cluster/backup")
def post_backup_job(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    job = {k: v for k, v in ctx.params.items()}
    jid = str(job.get("id") or f"backup-{len(cl.backup_jobs):08x}")
    if any(j.get("id") == jid for j in cl.backup_jobs):
        raise ApiError(500, f"Job '{jid}' already exists")
    job = {"id": jid, "type": "vzdump", "enabled": 1, **job}
    _check_selection(ctx, job)
    cl.backup_jobs.append(job)
    cl.touch()
    return None


@route("GET", "/cluster/backup/{id}")
def get_backup_job(ctx: Ctx) -> Any:
    return job_view(_job(ctx.rt.cluster, str(ctx.params["id"])), int(time.time()))


@route("PUT", "/cluster/backup/{id}")
def put_backup_job(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    j = _job(cl, str(ctx.params["id"]))
    new = dict(j)
    for k in [d for d in str(ctx.params.get("delete", "")).split(",") if d]:
        new.pop(k, None)
    new.update({k: v for k, v in ctx.params.items() if k not in ("id", "delete")})
    for sel in ("vmid", "pool", "all"):  # a new selection replaces the old one
        if sel in ctx.params:
            for other in {"vmid", "pool", "all"} - {sel}:
                new.pop(other, None)
    _check_selection(ctx, new)
    j.clear()
    j.update(new)
    cl.touch()
    return None


@route("DELETE", "/cluster/backup/{id}")
def delete_backup_job(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    cl.backup_jobs.remove(_job(cl, str(ctx.params["id"])))
    cl.touch()
    return None


@route("GET", "/cluster/backup/{id}/included_volumes")
def get_included_volumes(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    j = _job(cl, str(ctx.params["id"]))
    if j.get("all"):
        chosen = list(cl.guests.values())
    elif j.get("pool"):
        chosen = [g for g in cl.guests.values() if g.pool == j["pool"]]
    else:
        ids = {int(x) for x in str(j.get("vmid", "")).split(",") if x.strip()}
        chosen = [g for g in cl.guests.values() if g.vmid in ids]
    children = []
    for g in sorted(chosen, key=lambda g: g.vmid):
        vols = [
            {"id": k, "name": str(v), "included": 1, "reason": "default"}
            for k, v in sorted(g.config.items())
            if disks.is_disk(g.type, k) and "media=cdrom" not in str(v)
        ]
        children.append({"id": g.vmid, "name": g.name, "type": g.type, "children": vols, "leaf": 0})
    return {"children": children}


@route("GET", "/cluster/backup")
def get_backup_jobs(ctx: Ctx) -> Any:
    now = int(time.time())
    return [job_view(j, now) for j in ctx.rt.cluster.backup_jobs]
