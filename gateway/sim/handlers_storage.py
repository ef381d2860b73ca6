"""Storage content as PVE does it: one volume's info, notes and protection, deletion (a
task; a protected backup is refused, and nothing else: as in PVE (Content.pm delete ->
vdisk_free), a disk a guest still uses is deleted and its guest's config keeps naming it. PVE
also refuses a template's base image that linked clones still use; the simulator's linked
clones get disks of their own, so there is none), downloads from a URL (a task that
creates the file), URL metadata, allocating a disk image, storage RRD and one definition.

The simulator reaches no network: a download "fetches" from a small table of known files
(REMOTE); any other URL fails like a 404 would. A file's bytes are `sim:<url>`, so a caller
can compute the checksum PVE would verify.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from typing import Any
from urllib.parse import urlsplit

from gateway.sim import disks
from gateway.sim.errors import ApiError
from gateway.sim.handlers_read import _storage_on, get_storage_config
from gateway.sim.routes import Ctx, route
from gateway.sim.state import Cluster, Storage, Volume

# what the simulated internet holds: host -> path -> (size, mime type)
REMOTE: dict[str, dict[str, tuple[int, str]]] = {
    "cdimage.debian.org": {
        "/debian-cd/current/amd64/iso-cd/debian-12.8.0-amd64-netinst.iso": (659554304, "application/x-iso9660-image"),
    },
    "download.proxmox.com": {
        "/images/system/ubuntu-24.04-standard_24.04-2_amd64.tar.zst": (141460214, "application/zstd"),
    },
    "releases.ubuntu.com": {"/24.04/ubuntu-24.04.1-live-server-amd64.iso": (2773874688, "application/x-iso9660-image")},
    "mirror.example.net": {"/isos/tools.iso": (1048576, "application/x-iso9660-image")},
}
SUBDIR = {"iso": "iso", "vztmpl": "vztmpl", "import": "import"}


def _volume(cl: Cluster, s: Storage, node: str, volid: str) -> Volume:
    if not volid.startswith(f"{s.id}:"):
        volid = f"{s.id}:{volid}"
    for v in cl.volumes:
        if v.volid == volid and v.storage == s.id and (v.node is None or v.node == node):
            return v
    raise ApiError(500, f"volume '{volid}' does not exist")


def _path(s: Storage, v: Volume) -> str:
    name = v.volid.split(":", 1)[1]
    if s.type in ("lvmthin", "lvm"):
        return f"/dev/pve/{name}"
    if s.type == "zfspool":
        return f"/dev/zvol/rpool/data/{name}"
    if s.type == "pbs":
        return f"pbs://{s.server}/{name}"
    base = s.path or f"/mnt/pve/{s.id}"
    sub = {"iso": "template/iso", "vztmpl": "template/cache", "backup": "dump", "images": "images"}.get(v.content, "")
    return f"{base}/{sub}/{name.split('/', 1)[-1]}"


@route("GET", "/nodes/{node}/storage/{storage}/content/{volume}")
def get_volume(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    s = _storage_on(ctx, str(ctx.params["storage"]), node)
    v = _volume(cl, s, node, str(ctx.params["volume"]))
    if v.vmid is not None and not ctx.can(f"/storage/{s.id}", "Datastore.Allocate"):
        ctx.require(f"/vms/{v.vmid}", "VM.Audit")
    else:
        ctx.require(f"/storage/{s.id}", "Datastore.Audit", "Datastore.AllocateSpace", any_of=True)
    d: dict[str, Any] = {"format": v.format, "size": v.size, "used": v.used if v.used is not None else v.size,
                         "path": _path(s, v)}  # fmt: skip
    if v.notes is not None:
        d["notes"] = v.notes
    if v.content == "backup":
        d["protected"] = 1 if v.protected else 0
    return d


@route("PUT", "/nodes/{node}/storage/{storage}/content/{volume}")
def put_volume(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    s = _storage_on(ctx, str(ctx.params["storage"]), node)
    v = _volume(cl, s, node, str(ctx.params["volume"]))
    ctx.require(f"/storage/{s.id}", "Datastore.Allocate", "Datastore.AllocateSpace", any_of=True)
    if "protected" in ctx.params:
        if v.content != "backup":
            raise ApiError(500, "protection is only supported for backups")
        v.protected = bool(ctx.params["protected"])
    if "notes" in ctx.params:
        v.notes = str(ctx.params["notes"]) or None
    cl.touch()
    return None


@route("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}")
def delete_volume(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    s = _storage_on(ctx, str(ctx.params["storage"]), node)
    v = _volume(cl, s, node, str(ctx.params["volume"]))
    if not ctx.can(f"/storage/{s.id}", "Datastore.Allocate"):
        if v.content == "backup" and v.vmid is not None and ctx.can(f"/vms/{v.vmid}", "VM.Backup"):
            ctx.require(f"/storage/{s.id}", "Datastore.AllocateSpace")
        else:
            ctx.require(f"/storage/{s.id}", "Datastore.Allocate")
    if v.protected:
        raise ApiError(500, f"backup '{v.volid}' is protected - unable to delete")

    def work() -> list[str]:
        if v not in cl.volumes:
            raise ApiError(500, f"volume '{v.volid}' does not exist")
        if v.node is None:
            disks.free_volume(cl, v.volid)
        else:  # a file on one node's local storage: only that copy
            cl.volumes.remove(v)
            if s.used is not None:
                s.used = max(0, s.used - v.size)
        cl.touch()
        return [f"Removed volume '{v.volid}'"]

    # PVE's worker id (Content.pm delete): `<owner vmid>@<storage>` for a guest's volume, else `<storage>`
    worker = f"{v.vmid}@{s.id}" if v.vmid is not None else s.id
    return ctx.rt.tasks.start(node, "imgdel", worker, ctx.user, work).upid


def _remote(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    entry = REMOTE.get(parts.hostname or "", {}).get(parts.path)
    if entry is None:
        raise ApiError(500, f"invalid server response: '404 Not Found' for {url}")
    return parts.path.rsplit("/", 1)[-1], entry[0], entry[1]


@route("GET", "/nodes/{node}/query-url-metadata")
def get_url_metadata(ctx: Ctx) -> Any:
    filename, size, mime = _remote(str(ctx.params["url"]))
    return {"filename": filename, "size": size, "mimetype": mime}


@route("POST", "/nodes/{node}/storage/{storage}/download-url")
def post_download_url(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    node = str(p["node"])
    s = _storage_on(ctx, str(p["storage"]), node)
    content = str(p["content"])
    if content not in s.content:
        raise ApiError(500, f"storage '{s.id}' does not support content-type '{content}'")
    filename = str(p["filename"])
    volid = f"{s.id}:{SUBDIR[content]}/{filename}"
    if any(v.volid == volid and (v.node is None or v.node == node) for v in cl.volumes):
        raise ApiError(500, f"refusing to override existing file '{filename}'")
    url = str(p["url"])

    def work() -> list[str]:
        _, size, _ = _remote(url)
        if p.get("checksum"):
            algo = str(p.get("checksum-algorithm"))
            got = hashlib.new(algo, f"sim:{url}".encode()).hexdigest()
            if got != str(p["checksum"]).lower():
                raise ApiError(500, f"checksum mismatch: got '{got}' != expect '{p['checksum']}'")
        fmt = "iso" if content == "iso" else "tzst" if filename.endswith(".zst") else "tgz"
        cl.volumes.append(Volume(storage=s.id, volid=volid, content=content, format=fmt, size=size,
                                 node=None if s.shared else node, ctime=int(time.time())))  # fmt: skip
        if s.used is not None:
            s.used += size
        cl.touch()
        return [
            f"downloading {url} to {_path(s, cl.volumes[-1])}",
            f"{size} bytes downloaded",
            "download of '{url}' done",
        ]

    first = [f"starting file import from: {url}", f"target node: {node}", f"target file: {filename}"]
    return ctx.rt.tasks.start(node, "download", filename, ctx.user, work, first_log=first).upid


SIZE = re.compile(r"^([0-9]+)([MG]?)$")


@route("POST", "/nodes/{node}/storage/{storage}/content")
def post_allocate(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    p = ctx.params
    node = str(p["node"])
    s = _storage_on(ctx, str(p["storage"]), node)
    vmid = int(p["vmid"])
    ctx.require(f"/storage/{s.id}", "Datastore.AllocateSpace")
    ctx.require(f"/vms/{vmid}", "VM.Allocate", "VM.Config.Disk", any_of=True)
    if "images" not in s.content:
        raise ApiError(500, f"storage '{s.id}' does not support vm images")
    name = str(p["filename"])
    m = re.fullmatch(r"vm-([0-9]+)-disk-[0-9]+(?:[.](raw|qcow2|vmdk))?", name)
    if not m or int(m.group(1)) != vmid:
        raise ApiError(
            400, "Parameter verification failed.", {"filename": f"filename '{name}' must start with 'vm-{vmid}-'"}
        )
    if m.group(2) and s.type not in ("dir", "nfs", "cifs", "btrfs"):
        raise ApiError(500, f"storage '{s.id}' does not support format '{m.group(2)}' (raw only)")
    sm = SIZE.fullmatch(str(p["size"]))
    if not sm:
        raise ApiError(400, "Parameter verification failed.", {"size": "value does not match the regex pattern"})
    size = int(sm.group(1)) << {"": 10, "M": 20, "G": 30}[sm.group(2)]
    volid = f"{s.id}:{name}" if s.type not in ("dir", "nfs", "cifs", "btrfs") else f"{s.id}:{vmid}/{name}"
    if any(v.volid == volid for v in cl.volumes):
        raise ApiError(500, f"volume '{volid}' already exists")
    if s.total is not None and (s.used or 0) + size > s.total:
        raise ApiError(500, f"not enough free space on storage '{s.id}'")
    cl.volumes.append(Volume(storage=s.id, volid=volid, content="images", format=m.group(2) or "raw", size=size,
                             node=None if s.shared else node, vmid=vmid, ctime=int(time.time())))  # fmt: skip
    if s.used is not None:
        s.used += size
    cl.touch()
    return volid


@route("GET", "/nodes/{node}/storage/{storage}/rrddata")
def get_storage_rrd(ctx: Ctx) -> Any:
    node = str(ctx.params["node"])
    s = _storage_on(ctx, str(ctx.params["storage"]), node)
    step = {"hour": 60, "day": 1800, "week": 10800, "month": 43200, "year": 604800}[str(ctx.params["timeframe"])]
    last = int(time.time()) // step * step
    out = []
    for i in range(70):
        t = last - (69 - i) * step
        if s.total is None or not s.active or not s.enabled:
            out.append({"time": t})  # no samples: PVE leaves the values out
            continue
        used = int((s.used or 0) * (0.9 + 0.1 * i / 69) * (1 + 0.01 * math.sin(t / 7200)))
        out.append({"time": t, "total": s.total, "used": min(s.total, used)})
    return out


@route("GET", "/storage/{storage}")
def get_storage_definition(ctx: Ctx) -> Any:
    sid = str(ctx.params["storage"])
    if sid not in ctx.rt.cluster.storages:
        raise ApiError(500, f"storage '{sid}' does not exist")
    rows = [r for r in get_storage_config(Ctx(ctx.rt, ctx.principal, "GET", "/storage", {})) if r["storage"] == sid]
    return rows[0]
