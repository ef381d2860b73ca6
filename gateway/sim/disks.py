"""Guest configuration semantics shared by create and config updates: new disks
("storage:SIZE" allocates a volume), detaching (a disk becomes unusedN), deleting an
unusedN (its volume is destroyed), NICs (a line without a MAC gets a new one), ISO media and
pending changes (a running guest's non-hotpluggable settings wait for its next start).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.state import Cluster, Guest, Volume
from gateway.sim.tags import unique_tags

GiB = 1 << 30
QEMU_DISK = re.compile(r"^(scsi|virtio|sata|ide|efidisk|tpmstate)[0-9]+$")
LXC_DISK = re.compile(r"^(rootfs|mp[0-9]+)$")
NEW_VOLUME = re.compile(r"^([a-z][a-z0-9._-]*[a-z0-9]):([0-9]+)(,.*)?$")
NEW_CLOUDINIT = re.compile(r"^([a-z][a-z0-9._-]*[a-z0-9]):cloudinit(,.*)?$")
# settings QEMU cannot change while the VM runs (PVE's default hotplug is network,disk,usb)
NOT_HOTPLUG = {"cores", "sockets", "cpu", "machine", "bios", "ostype", "boot", "memory", "numa", "vga"}


def is_disk(kind: str, key: str) -> bool:
    return bool((QEMU_DISK if kind == "qemu" else LXC_DISK).match(key))


def mac(vmid: int, idx: int, n: int = 0) -> str:
    h = hashlib.sha256((f"{vmid}/{idx}/sim" + (f"/{n}" if n else "")).encode()).digest()
    return "BC:24:11:" + ":".join(f"{b:02X}" for b in h[:3])


MAC = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")


def fresh_mac(g: Guest, idx: int) -> str:
    """A MAC none of the guest's interfaces has (Proxmox draws a random one; this is stable)."""
    lines = [v for d in (g.config, g.pending) for k, v in d.items() if k.startswith("net") and k[3:].isdigit()]
    used = {m.upper() for line in lines for m in MAC.findall(str(line))}
    n = 0
    while mac(g.vmid, idx, n) in used:
        n += 1
    return mac(g.vmid, idx, n)


def _opts(line: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in line.split(","):
        k, _, v = part.partition("=")
        out[k] = v
    return out


def volid_of(line: str) -> str | None:
    first = str(line).split(",", 1)[0]
    return first if ":" in first and not first.startswith("none") else None


def size_of(line: str) -> int:
    m = re.search(r"(?:^|,)size=([0-9]+)([KMGT]?)", str(line))
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": GiB, "T": 1 << 40}[m.group(2)]


def _next_disk_number(cl: Cluster, storage: str, vmid: int) -> int:
    used = {v.volid for v in cl.volumes if v.storage == storage}
    n = 0
    while f"{storage}:vm-{vmid}-disk-{n}" in used:
        n += 1
    return n


def allocate(cl: Cluster, g: Guest, key: str, value: str) -> str:
    """`local-lvm:32,...` -> a new 32 GiB volume; the config line names it with its size."""
    m = NEW_VOLUME.match(value)
    if not m:
        return value
    storage, gib, rest = m.group(1), int(m.group(2)), m.group(3) or ""
    st = cl.storages.get(storage)
    if st is None:
        raise ApiError(500, f"storage '{storage}' does not exist")
    want = "images" if g.type == "qemu" else "rootdir"
    if want not in st.content:
        raise ApiError(500, f"storage '{storage}' does not support content-type '{want}'")
    if not st.active:
        raise ApiError(500, f"storage '{storage}' is not online")
    size = gib * GiB
    if st.total is not None and (st.used or 0) + size > st.total:
        raise ApiError(500, f"unable to allocate {gib} GiB on storage '{storage}': not enough free space")
    name = f"vm-{g.vmid}-disk-{_next_disk_number(cl, storage, g.vmid)}"
    cl.volumes.append(
        Volume(
            storage=storage,
            volid=f"{storage}:{name}",
            content=want,
            format="raw",
            size=size,
            node=None if st.shared else g.node,
            vmid=g.vmid,
            ctime=int(time.time()),
        )
    )
    if st.used is not None:
        st.used += size
    return f"{storage}:{name}{rest},size={gib}G"


def free_volume(cl: Cluster, volid: str) -> None:
    for v in list(cl.volumes):
        if v.volid == volid:
            cl.volumes.remove(v)
            st = cl.storages.get(v.storage)
            if st is not None and st.used is not None:
                st.used = max(0, st.used - v.size)


def _unused_slot(cfg: dict[str, Any]) -> str:
    n = 0
    while f"unused{n}" in cfg:
        n += 1
    return f"unused{n}"


def check_media(cl: Cluster, value: str) -> None:
    """ide2=local:iso/x.iso,media=cdrom needs that ISO to exist."""
    volid = volid_of(value)
    if volid and "media=cdrom" in value and ":iso/" in volid and not any(v.volid == volid for v in cl.volumes):
        raise ApiError(500, f"volume '{volid}' does not exist")


def set_key(cl: Cluster, g: Guest, key: str, value: Any) -> None:
    """Apply one config assignment as PVE does (allocation, MACs, media, pending)."""
    value = str(value) if not isinstance(value, int) else value
    if key == "tags":  # GuestHelpers::get_unique_tags: lower-cased, each once, sorted, `;`-joined
        value = unique_tags(value)
    if isinstance(value, str):
        if key.startswith("net") and key[3:].isdigit():
            value = with_mac(g, key, value)
        elif is_disk(g.type, key) or key.startswith("ide"):
            check_media(cl, value)
            if key in g.config and NEW_VOLUME.match(value) and volid_of(str(g.config[key])):
                # PVE does not refuse a new volume in a slot in use: the disk there is kept as unusedN
                # (hot-unplugged from a running VM), and the new one takes its place
                g.config[_unused_slot(g.config)] = volid_of(str(g.config[key]))
            value = allocate(cl, g, key, value)
            if g.type == "qemu" and (ci := NEW_CLOUDINIT.match(value)):
                # PVE allocates the cloud-init drive and records it as a CD-ROM: vm-N-cloudinit,media=cdrom
                rest = ",".join(p for p in (ci.group(2) or "").split(",") if p and not p.startswith("media="))
                value = f"{ci.group(1)}:vm-{g.vmid}-cloudinit,media=cdrom" + (f",{rest}" if rest else "")
    if g.type == "qemu" and g.status != "stopped" and key in NOT_HOTPLUG:
        g.pending[key] = value
        return
    g.config[key] = value


def with_mac(g: Guest, key: str, value: str) -> str:
    """A NIC line that names no MAC gets a new one, as Proxmox gives it: setting netN replaces
    the whole line, and the interface's old MAC is not kept (qemu-server's parse_net and
    pve-container's parse_lxc_network draw a random MAC for a line without one)."""
    model, _, rest = value.partition(",")
    options = value.split(",")
    if g.type == "lxc":  # name=eth0,bridge=...: the MAC is hwaddr=
        if any(o.startswith("hwaddr=") for o in options):
            return value
        return f"{value},hwaddr={fresh_mac(g, int(key[3:]))}"
    if "=" in model or any(o.startswith("macaddr=") for o in options):  # model=MAC, or macaddr= given
        return value
    return f"{model}={fresh_mac(g, int(key[3:]))}" + (f",{rest}" if rest else "")


def delete_key(cl: Cluster, g: Guest, key: str) -> None:
    """Deleting a disk detaches it (unusedN); deleting an unusedN destroys its volume."""
    if key not in g.config and key not in g.pending:
        return  # PVE ignores deleting an unset option
    line = str(g.config.get(key, ""))
    if g.type == "lxc" and key == "rootfs":
        raise ApiError(500, "unable to delete 'rootfs' - option is required")
    if key.startswith("unused"):
        volid = volid_of(line)
        if volid:
            free_volume(cl, volid)
    elif is_disk(g.type, key) and "media=cdrom" not in line:
        volid = volid_of(line)
        if volid:
            g.config[_unused_slot(g.config)] = volid
    g.config.pop(key, None)
    g.pending.pop(key, None)


def apply_pending(g: Guest) -> None:
    g.config.update(g.pending)
    g.pending.clear()
