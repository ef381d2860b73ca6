"""Creating guests and changing their disks: create, convert to template, resize, move.

As in PVE, the synchronous checks (id in use, permissions, unknown pool or storage)
answer 500 before a worker forks; allocation happens inside the task, under the
guest's lock, and a failed create leaves no guest behind.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.sim import disks, handlers_backup
from gateway.sim.errors import ApiError
from gateway.sim.handlers_write import _set_running, _start_task, _word, check_lock, sync_from_config
from gateway.sim.routes import Ctx, both, kind_of, route
from gateway.sim.state import Guest

GiB = disks.GiB
CREATE_FIELDS_SKIPPED = {"node", "vmid", "pool", "start", "password", "ssh-public-keys", "storage"}


def _new_guest(ctx: Ctx, kind: str) -> tuple[Guest, dict[str, Any]]:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    vmid = int(ctx.params["vmid"])
    pool = ctx.params.get("pool")
    if not (ctx.can(f"/vms/{vmid}", "VM.Allocate") or (pool and ctx.can(f"/pool/{pool}", "VM.Allocate"))):
        ctx.require(f"/vms/{vmid}", "VM.Allocate")
    if vmid in cl.guests:
        raise ApiError(500, f"unable to create {'VM' if kind == 'qemu' else 'CT'} {vmid}: config file already exists")
    if pool and pool not in cl.pools:
        raise ApiError(500, f"pool '{pool}' does not exist")
    if not ctx.rt.node_online(node):
        raise ApiError(595, f"no route to host {node}")
    for key, value in ctx.params.items():
        volid = disks.volid_of(str(value)) if isinstance(value, str) else None
        if volid and (disks.is_disk(kind, key) or key in ("ide2", "ostemplate")):
            store = volid.split(":", 1)[0]
            if store not in cl.storages:
                raise ApiError(500, f"storage '{store}' does not exist")
            ctx.require(f"/storage/{store}", "Datastore.AllocateSpace")
    name_key = "name" if kind == "qemu" else "hostname"
    g = Guest(
        vmid=vmid,
        type=kind,  # type: ignore[arg-type]
        node=node,
        name=str(ctx.params.get(name_key, f"{'VM' if kind == 'qemu' else 'CT'}{vmid}")),
        status="stopped",
        pool=str(pool) if pool else None,
        lock="create",
        maxdisk=0,
    )
    fields = {k: v for k, v in ctx.params.items() if k not in CREATE_FIELDS_SKIPPED}
    return g, fields


def _create(ctx: Ctx, kind: str) -> Any:
    if ctx.params.get("archive" if kind == "qemu" else "restore"):
        return handlers_backup.restore(ctx, kind)
    cl = ctx.rt.cluster
    g, fields = _new_guest(ctx, kind)
    if kind == "lxc":
        tpl = str(fields.pop("ostemplate"))
        if not any(v.volid == tpl and v.content == "vztmpl" for v in cl.volumes):
            raise ApiError(500, f"volume '{tpl}' does not exist")
    defaults: dict[str, Any] = (
        {"cores": 1, "sockets": 1, "memory": 512} if kind == "qemu" else {"cores": 1, "memory": 512, "swap": 512}
    )

    def begin() -> list[str]:
        cl.guests[g.vmid] = g  # the (locked) config exists while the disks are allocated
        cl.touch()
        return []

    def work() -> list[str]:
        lines: list[str] = []
        for k, v in {**defaults, **fields}.items():
            disks.set_key(cl, g, k, v)
            if str(v) != str(g.config.get(k)) and disks.is_disk(g.type, k):
                lines.append(f"{k}: successfully created disk '{g.config[k]}'")
        root = "scsi0" if kind == "qemu" else "rootfs"
        g.maxdisk = disks.size_of(str(g.config.get(root, "")))
        sync_from_config(g)
        g.lock = None
        if ctx.params.get("start"):
            _set_running(g)
        cl.touch()
        return lines

    def finish(ok: bool) -> None:
        if not ok:  # PVE removes a half-created guest and its volumes
            cl.guests.pop(g.vmid, None)
            for v in [v for v in cl.volumes if v.vmid == g.vmid and v.content in ("images", "rootdir")]:
                disks.free_volume(cl, v.volid)

    task = ctx.rt.tasks.start(
        g.node, "qmcreate" if kind == "qemu" else "vzcreate", str(g.vmid), ctx.user, work, begin=begin, on_finish=finish
    )
    return task.upid


@route("POST", "/nodes/{node}/qemu")
def post_qemu_create(ctx: Ctx) -> Any:
    return _create(ctx, "qemu")


@route("POST", "/nodes/{node}/lxc")
def post_lxc_create(ctx: Ctx) -> Any:
    return _create(ctx, "lxc")


# ---- template ------------------------------------------------------------------


def _to_template(ctx: Ctx, g: Guest) -> None:
    cl = ctx.rt.cluster
    for key, line in list(g.config.items()):
        volid = disks.volid_of(str(line)) if disks.is_disk(g.type, key) else None
        if not volid or f"vm-{g.vmid}-" not in volid:
            continue
        base = volid.replace(f"vm-{g.vmid}-", f"base-{g.vmid}-")
        g.config[key] = str(line).replace(volid, base)
        for v in cl.volumes:
            if v.volid == volid:
                v.volid = base
    g.config["template"] = 1
    sync_from_config(g)
    cl.touch()


@both("POST", "/nodes/{node}/{kind}/{vmid}/template")
def post_template(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    check_lock(g)
    if g.template:
        raise ApiError(500, f"{_word(g)} {g.vmid} is already a template")
    if g.status != "stopped":
        raise ApiError(
            500, "you can't convert a VM to template if VM is running" if g.type == "qemu" else "CT is running"
        )
    if g.type == "lxc":  # pct template runs in the API process: no task, null result
        _to_template(ctx, g)
        return None

    def begin() -> None:
        g.lock = "template"

    def work() -> list[str]:
        g.lock = None
        _to_template(ctx, g)
        return []

    return _start_task(ctx, g, "qmtemplate", work, begin)


# ---- resize ----------------------------------------------------------------------

SIZE = re.compile(r"^(\+?)([0-9]+(?:\.[0-9]+)?)([KMGT]?)$")


@both("PUT", "/nodes/{node}/{kind}/{vmid}/resize")
def put_resize(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cl = ctx.rt.cluster
    disk = str(ctx.params["disk"])
    m = SIZE.match(str(ctx.params["size"]))
    if not m:
        raise ApiError(400, "Parameter verification failed.", {"size": "value does not match the regex pattern"})
    check_lock(g)
    line = str(g.config.get(disk, ""))
    volid = disks.volid_of(line)
    if not disks.is_disk(g.type, disk) or not volid or "media=cdrom" in line:
        raise ApiError(500, f"disk '{disk}' does not exist" if not line else f"can't resize {disk}: not a disk")
    old = disks.size_of(line)
    amount = int(float(m.group(2)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": GiB, "T": 1 << 40}[m.group(3)])
    new = old + amount if m.group(1) else amount
    if new < old:
        raise ApiError(500, "shrinking disks is not supported")
    vol = next((v for v in cl.volumes if v.volid == volid), None)
    st = cl.storages.get(volid.split(":", 1)[0])

    def work() -> list[str]:
        if st is not None and st.total is not None and (st.used or 0) + (new - old) > st.total:
            raise ApiError(500, f"unable to resize {disk}: not enough free space on storage '{st.id}'")
        g.config[disk] = re.sub(r"size=[0-9]+[KMGT]?", f"size={new // GiB}G", line)
        if vol is not None:
            vol.size = new
        if st is not None and st.used is not None:
            st.used += new - old
        if disk in ("scsi0", "virtio0", "rootfs"):
            g.maxdisk = new
        cl.touch()
        return [f"Resizing image: {new // GiB} GiB"]

    return _start_task(ctx, g, "resize", work)


# ---- move ------------------------------------------------------------------------


def _move(ctx: Ctx, key: str, wtype: str) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    cl = ctx.rt.cluster
    disk = str(ctx.params[key])
    storage = str(ctx.params["storage"])
    line = str(g.config.get(disk, ""))
    volid = disks.volid_of(line)
    if not volid:
        raise ApiError(500, f"disk '{disk}' does not exist")
    if volid.split(":", 1)[0] == storage:
        raise ApiError(500, "you can't move to the same storage with same format")
    if g.type == "lxc" and g.status != "stopped":
        raise ApiError(500, "cannot move volumes of a running container")
    if storage not in cl.storages:
        raise ApiError(500, f"storage '{storage}' does not exist")
    ctx.require(f"/storage/{storage}", "Datastore.AllocateSpace")
    check_lock(g)
    size = disks.size_of(line)

    def begin() -> None:
        g.lock = "disk" if g.type == "qemu" else "move_volume"

    def work() -> list[str]:
        g.lock = None
        rest = line.split(",", 1)[1] if "," in line else ""
        rest = re.sub(r"(^|,)size=[^,]*", "", rest).strip(",")
        new_line = disks.allocate(cl, g, disk, f"{storage}:{max(1, size // GiB)}" + (f",{rest}" if rest else ""))
        g.config[disk] = new_line
        if ctx.params.get("delete"):
            disks.free_volume(cl, volid)
        else:
            n = 0
            while f"unused{n}" in g.config:
                n += 1
            g.config[f"unused{n}"] = volid
        cl.touch()
        return [f"moving disk {volid} to {storage}: done"]

    return _start_task(ctx, g, wtype, work, begin)


@route("POST", "/nodes/{node}/qemu/{vmid}/move_disk")
def post_move_disk(ctx: Ctx) -> Any:
    return _move(ctx, "disk", "qmmove")


@route("POST", "/nodes/{node}/lxc/{vmid}/move_volume")
def post_move_volume(ctx: Ctx) -> Any:
    return _move(ctx, "volume", "move_volume")


# ---- cloud-init --------------------------------------------------------------------


@route("PUT", "/nodes/{node}/qemu/{vmid}/cloudinit")
def put_cloudinit(ctx: Ctx) -> Any:
    g = ctx.guest("qemu")
    check_lock(g)
    if not any("cloudinit" in str(v) for v in g.config.values()):
        raise ApiError(500, f"VM {g.vmid} has no cloud-init drive")
    # PVE rebuilds the drive from the pending cloud-init settings
    for k in [k for k in g.pending if k.startswith(("ci", "ipconfig", "sshkeys", "nameserver", "searchdomain"))]:
        g.config[k] = g.pending.pop(k)
    ctx.rt.cluster.touch()
    return None
