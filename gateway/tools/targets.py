"""Target facts for the policy: what guest or node a call names, looked up from
a short-lived cache of the cluster's /cluster/resources."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from gateway.tools.runtimes.base import ToolError, UpstreamError
from gateway.tools.runtimes.pve_api import UPID_RE, PveApiClient, upid_node
from gateway.tools.runtimes.reducers import tag_list
from gateway.tools.tool import Tool, parse_release

# an allocating call's hold on its pool: (cluster, pool, amounts) -> what earlier holds add (store/holds.py)
TakeHold = Callable[[str, str, Mapping[str, int]], Awaitable[dict[str, int]]]

MiB = 1 << 20
GiB = 1 << 30


def unknown_target(cluster: str | None) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": None,
        "vmid": None,
        "type": None,
        "name": None,
        "tags": [],
        "pool": None,
        "status": None,
        "ha_state": None,
        "storage": None,
        "known": False,
        "pool_known": True,  # nothing listed hides its pool: `known` says the guest is not known
    }


def sees_every_pool(permissions: Any) -> bool:
    """Whether a token whose effective privileges GET /access/permissions answered (path ->
    privilege -> propagate flag) sees every pool. Proxmox's /cluster/resources deletes a guest's
    `pool` unless the token has Pool.Audit on /pool/<pool>: a guest listed without one stands in
    no pool only then; otherwise its pool is unknown.

    Proxmox answers `/pool` whenever anything is held there, worked out as every check works it
    out: an ACL on `/pool` overrides the one on `/`, and `/`'s reaches `/pool` only when it
    propagates. Pool.Audit there with the propagate flag set reaches every pool, except one whose
    own ACL overrides it: the answer lists every ACL path, so such a `/pool/<id>` without
    Pool.Audit says not every pool is seen. (A pool ACL that leaves the token nothing there is
    not listed: NoAccess, which also takes VM.Audit on the pool's guests, so they are not listed
    either; or a custom role without privileges, which cannot be told apart from no ACL.)"""
    if not isinstance(permissions, dict):
        return False
    root = permissions.get("/pool")
    if not isinstance(root, dict) or root.get("Pool.Audit") not in (1, "1"):  # 1 == True
        return False
    return all(
        isinstance(privs, dict) and "Pool.Audit" in privs
        for path, privs in permissions.items()
        if isinstance(path, str) and path.startswith("/pool/")
    )


# a vzdump archive (vzdump-qemu-101-2024_...) or a PBS snapshot (backup/vm/101/2024-...)
_BACKUP_VMID = re.compile(r"(?:vzdump-(?:qemu|lxc|openvz)-|:backup/(?:vm|ct)/|/(?:vm|ct)/)([0-9]{1,9})(?:[-/])")


def backup_vmid(volume: Any) -> int | None:
    """The id of the guest a backup volume was taken of; None when the name does not say."""
    m = _BACKUP_VMID.search(volume) if isinstance(volume, str) else None
    return int(m.group(1)) if m else None


# one guest of a member list: a guest id (101), an HA resource id (vm:101, ct:201), a
# replication job id (101-0: the guest it replicates, then the job's number) or an ACL path on
# one guest (/vms/101)
_MEMBER = re.compile(r"(?:(?:vm|ct):|/vms/)?([0-9]{1,9})(?:-[0-9]{1,9})?")


def member_ids(value: Any) -> list[int]:
    """The guest ids a comma-separated member list names, each once, in order; ValueError for an
    item that is none of the forms above (its guest is not known: an ACL path on a pool, a storage
    or everything). A task's UPID names the guest of its id field, or none (a node's task)."""
    if isinstance(value, str) and (m := UPID_RE.fullmatch(value)) is not None:
        return [int(m["id"])] if m["id"].isdigit() else []
    if isinstance(value, str) and value.split("/")[1:2] in (["storage"], ["nodes"], ["access"], ["sdn"], ["mapping"]):
        return []  # an ACL path on no guest (Proxmox's /vms and /pool trees are the guests')
    ids: list[int] = []
    for item in str(value or "").split(","):
        if not item.strip():
            continue
        m = _MEMBER.fullmatch(item.strip())
        if m is None:
            raise ValueError("not a guest id")
        ids.append(int(m.group(1)))
    return list(dict.fromkeys(ids))


def _members_beyond_the_list(tool: Tool, arguments: dict[str, Any]) -> bool:
    """Whether the call reaches guests its member list does not name: a pool's (members_pool: every
    guest of it, those added later too), every guest (members_all), or, the list not given, those the
    object it changes has saved (members_saved: a job's or a rule's). None of those is looked up:
    the members are not known, and every scoped deny holds."""
    t = tool.target
    if (p := t.get("members_pool")) and arguments.get(p) not in (None, ""):
        return True
    if (p := t.get("members_all")) and arguments.get(p) is True:
        return True
    return bool(t.get("members_saved")) and arguments.get(t["members"]) in (None, "")


def _job_beyond_its_ids(job: dict[str, Any]) -> bool:
    """A saved backup job that selects a pool's guests or every guest (guests joining later too)."""
    return job.get("pool") not in (None, "") or str(job.get("all", 0)) not in ("0", "", "False", "false")


def _job_enabled(job: dict[str, Any] | None) -> bool:
    """Whether a saved backup job runs (Proxmox's `enabled`, 1 when absent); False when not known."""
    return job is not None and str(job.get("enabled", 1)) not in ("0", "False", "false")


def _keeps_all(retention: Any) -> bool:
    """Whether a prune-backups value (Proxmox's property string, or the object it may answer) keeps
    every backup: keep-all=1, which Proxmox admits with no other option."""
    if isinstance(retention, dict):
        return str(retention.get("keep-all")) in ("1", "True", "true")
    parts = [p.strip() for p in str(retention).split(",") if p.strip()]
    return parts == ["keep-all=1"]


# A guest's volume, as Proxmox's storage plugins name it (parse_volname): a disk image, a
# template's base image, a container's subvolume, a cloud-init drive, a saved VM state, an EFI
# or TPM disk (vm-101-disk-0, base-100-disk-0, subvol-200-disk-0, basevol-..., vm-101-cloudinit,
# vm-101-state-snap1); a linked clone's last (base-100-disk-0/vm-101-disk-0); on a directory
# storage under the owner's directory (101/vm-101-disk-0.qcow2, a linked clone's
# 100/base-100-disk-0.qcow2/101/vm-101-disk-0.qcow2) or a container's directory (rootdir/200).
_GUEST_IMAGE = re.compile(r"^(?:vm|base|subvol|basevol)-([0-9]+)-", re.IGNORECASE)
_BASE_IMAGE = re.compile(r"^(?:base|basevol)-[0-9]+-", re.IGNORECASE)
_DIR_IMAGE = re.compile(r"^(?:[0-9]+/[^/]+/)?([0-9]+)/([^/]+)$")
_ROOTDIR = re.compile(r"^rootdir/([0-9]+)$")
_NO_OWNER = ("iso/", "vztmpl/", "snippets/", "import/")  # content no guest owns


def volume_owner(volume: Any) -> tuple[str, int | None] | None:
    """(content, vmid): the guest a volume id says it belongs to, `content` "images" (a disk,
    whatever its role) or "backup". vmid None: the name is a guest's disk's but does not say
    which guest unambiguously (two ids that disagree, an image name nested where no plugin
    puts one): unknown, never "nobody's". None when the name says no guest owns it (an ISO, a
    template, a snippet, a backup whose name carries no id, a LUN)."""
    if not isinstance(volume, str):
        return None
    _, colon, name = volume.partition(":")
    if not colon or not name or name.startswith(_NO_OWNER):
        return None
    if name.startswith("backup/"):  # a vzdump archive, a PBS snapshot: only under backup/
        vmid = backup_vmid(volume)
        return ("backup", vmid) if vmid is not None else None
    if m := _ROOTDIR.match(name):
        return "images", int(m.group(1))
    if m := _DIR_IMAGE.match(name):  # a directory storage's: the owner is the directory
        file = _GUEST_IMAGE.match(m.group(2))
        if file is not None and int(file.group(1)) != int(m.group(1)):
            return "images", None
        return "images", int(m.group(1))
    parts = name.split("/")
    last = _GUEST_IMAGE.match(parts[-1])
    if last is not None and (len(parts) == 1 or (len(parts) == 2 and _BASE_IMAGE.match(parts[0]))):
        return "images", int(last.group(1))
    if any(_GUEST_IMAGE.match(p) for p in parts):
        return "images", None
    return None


def destination(tool: Tool, arguments: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """The guest as the call leaves it: the target's facts, with what the call names instead. A
    declared pool not given is no pool (Proxmox puts the new guest in none); one not declared is the
    target's, known as far as the target's is (pool_known: a migration); a node not given is
    the target's (a clone stays on its source's node); a node declared null is unknown (an HA
    group's: the HA manager picks it)."""
    names = tool.destination
    vmid = arguments.get(vmid_param) if (vmid_param := names.get("vmid")) else target.get("vmid")
    node = target.get("node")
    if "node" in names:
        node_param = names["node"]
        node = arguments.get(node_param, node) if node_param else None
    pool_param = names.get("pool")
    return {
        "cluster": target.get("cluster"),
        "node": node,
        "vmid": int(vmid) if vmid is not None else None,
        "pool": arguments.get(pool_param) if pool_param else target.get("pool"),
        "pool_known": True if pool_param else target.get("pool_known", True),
        "tags": list(target.get("tags") or []),  # a clone copies its source's tags; a migration keeps them
    }


def unresolved(tool: Tool, arguments: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """The target of a call whose inventory lookup failed: still not known, but with what the call
    itself names, so a deny scoped to a node, a vmid range or a pool holds on it (a target without
    them escaped every scoped deny). The node only where Proxmox acts on the one named (a node's
    call, or a path the guest is not located for); a named guest's pool is not known (pool_known
    false), a new guest's is the one the call names."""
    t = tool.target
    vmid_param, node_param, new_param = t.get("vmid"), t.get("node"), t.get("new_vmid")
    named = vmid_param in arguments or new_param in arguments
    runs_there = f"{{{node_param}}}" in str(tool.spec.get("path", "")) and not tool.spec.get("locate")
    if node_param in arguments and (not named or runs_there):
        target["node"] = arguments[node_param]
    if vmid_param in arguments:
        target.update(vmid=int(arguments[vmid_param]), pool_known=False)
    elif new_param in arguments:
        pool_param = t.get("pool")
        target.update(vmid=int(arguments[new_param]), pool=arguments.get(pool_param) if pool_param else None)
    return target


# a guest config's lines: `key: value` (lxc.* raw keys carry dots)
_CONFIG_LINE = re.compile(r"^([a-z][a-z0-9_.-]*):\s*(.*?)\s*$")
_DISK_KEY = {
    "qemu": re.compile(r"^(ide|sata|scsi|virtio|efidisk|tpmstate)[0-9]+$"),
    "lxc": re.compile(r"^(rootfs|mp[0-9]+)$"),
}
_SIZE = re.compile(r"^([0-9]+(?:[.][0-9]+)?)([KMGT]?)$")
_UNIT = {"": 1, "K": 1 << 10, "M": MiB, "G": GiB, "T": 1 << 40}


def config_text(text: Any) -> dict[str, str]:
    """A guest configuration file's text (what GET /nodes/{node}/vzdump/extractconfig answers for
    a backup) as the mapping GET .../config answers: its `key: value` lines up to the first
    section (a snapshot, [PENDING], [special:...]); `#` lines (the description, vzdump's
    `#qmdump#map:` lines) are no settings. ValueError for anything else: a size that cannot be
    read is not guessed."""
    if not isinstance(text, str):
        raise ValueError("the backup's configuration is not text")
    config: dict[str, str] = {}
    for raw in text.split("\n"):  # as Proxmox reads it: a description may hold U+2028, \x85, \x0b
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            break
        m = _CONFIG_LINE.match(line)
        if m is None:
            raise ValueError(f"not a configuration line: {line[:80]!r}")
        config[m.group(1)] = m.group(2)
    if not config:
        raise ValueError("the backup's configuration holds no settings")
    return config


def _options(line: Any) -> tuple[str, dict[str, str]]:
    """A property string `volume,key=value,...` as (volume, options); a volume given by its
    key (`file=` for a VM's drive, `volume=` for a container's) is the volume too."""
    volume, opts = "", {}
    for i, part in enumerate(p for p in str(line).split(",") if p):
        key, eq, value = part.partition("=")
        if not eq and i == 0:
            volume = part
        else:
            opts[key] = value
    return volume or opts.get("file") or opts.get("volume", ""), opts


def sockets_of(kind: Any, config: dict[str, Any]) -> int:
    """A VM's sockets (its cores count once per socket); 1 for a container."""
    return int(config.get("sockets") or 1) if kind == "qemu" else 1


def swap_of(kind: Any, config: dict[str, Any]) -> int:
    """A container's swap in MiB (PVE's default: 512), memory it may take from its node; 0 for a VM."""
    return int(config.get("swap", 512)) if kind == "lxc" else 0


def memory_of(config: dict[str, Any]) -> int:
    """The memory setting in MiB (PVE's default: 512); a VM's may read `current=N` (PVE 8.1+)."""
    value = str(config.get("memory", 512))
    return int(_options(value)[1].get("current", 512) if "=" in value else value)


def disk_bytes(kind: Any, config: dict[str, Any], strict: bool = True, from_backup: bool = False) -> int:
    """The volumes a guest's config names, summed by their recorded sizes (a VM's CD-ROM drives
    and empty drives are no disk; a container's bind and device mounts allocate nothing).
    `strict`: any other volume without a recorded size is a ValueError, not a free disk (what is
    not known is refused); otherwise it counts 0 (a guest's current disks before a restore over
    it: its growth only looks larger). `from_backup`: the config is a backup's, and a VM's drive
    excluded from it (backup=0) is left out by a restore, so one without a recorded size is no
    error (one with a size still counts: an over-count, never an under-count). A guest's own
    config (a pool member's, a clone's source) has no such exception: every volume it names
    exists, and a clone copies it."""
    total = 0
    for key, line in config.items():
        if not _DISK_KEY["qemu" if kind == "qemu" else "lxc"].match(key):
            continue
        volume, opts = _options(line)
        if volume in ("", "none") or opts.get("media") == "cdrom":
            continue
        if kind == "lxc" and volume.startswith("/"):  # a bind or device mount
            continue
        m = _SIZE.match(opts.get("size", ""))
        if m is None:
            if not strict or (from_backup and opts.get("backup") in ("0", "no")):
                continue
            raise ValueError(f"{key} records no size")
        total += int(float(m.group(1)) * _UNIT[m.group(2)])
    return total


def cores_of(kind: Any, config: dict[str, Any], node_cpus: int | None = None) -> int:
    """A guest's cores as a create counts them: a VM's cores times its sockets; a container's
    `cores`, or without it every core of its node (`node_cpus`: unknown is a ValueError, never 0)."""
    if kind == "qemu":
        return int(config.get("cores") or 1) * sockets_of(kind, config)
    if kind != "lxc":
        raise ValueError(f"not a guest type: {kind!r}")
    if config.get("cores"):
        return int(config["cores"])
    if node_cpus:
        return int(node_cpus)
    raise ValueError("a container without cores, on a node whose cores are not known")


def size_parts(
    kind: Any, config: dict[str, Any], node_cpus: int | None = None, from_backup: bool = False
) -> tuple[int, int, int]:
    """(cores, memory in MiB, disk in bytes) of the guest a configuration describes, counted as a
    create counts them: a VM's cores times its sockets, a container's memory plus its swap (a
    container without `cores` may use every core of its node: `node_cpus`; unknown is a
    ValueError, never 0), every disk by its recorded size (see disk_bytes)."""
    cores = cores_of(kind, config, node_cpus)
    return cores, memory_of(config) + swap_of(kind, config), disk_bytes(kind, config, from_backup=from_backup)


def guest_size(
    kind: Any, config: dict[str, Any], node_cpus: int | None = None, from_backup: bool = False
) -> dict[str, int]:
    """The size of the guest a configuration describes, counted as a create counts it (see
    size_parts), its disks in whole GiB, rounded up."""
    cores, memory_mib, disk = size_parts(kind, config, node_cpus, from_backup)
    return {"cores": cores, "memory_mib": memory_mib, "disk_gib": -(-disk // GiB)}


def _summed(sizes: list[tuple[int, int, int]]) -> dict[str, int]:
    """What guests sized by size_parts hold together, as a pool's usage counts it: their disks
    summed in bytes, then rounded up to whole GiB."""
    return {
        "guests": len(sizes),
        "cores": sum(c for c, _, _ in sizes),
        "memory_mib": sum(m for _, m, _ in sizes),
        "disk_gib": -(-sum(d for _, _, d in sizes) // GiB),
    }


def url_host(url: Any) -> str | None:
    """The lower-case host name of an http(s) URL; None when there is none to trust (a
    userinfo part such as http://allowed.example@evil.example is refused outright)."""
    if not isinstance(url, str):
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # a malformed port raises
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not host or "@" in parts.netloc:
        return None
    return host.rstrip(".").lower() or None


def _node_cpus(nodes: dict[str, Any], node: Any) -> int | None:
    """A node's cores from its /cluster/resources row; None when not known (pvestatd fills
    maxcpu in a while after the node joins): never 0."""
    value = (nodes.get(node) or {}).get("maxcpu")
    return int(value) if value else None


CONFIG_READS = 8  # guest configs read at once while a pool's usage is summed


class _Configs:
    """Guests' configurations (GET /nodes/{node}/{type}/{vmid}/config) for one resources()
    call: each read once (a resize's guest is also its pool's member), at most CONFIG_READS
    at a time, over the cluster's one client."""

    def __init__(self, client: PveApiClient | None) -> None:
        self.client = client
        self._reads: dict[int, asyncio.Task[dict[str, Any]]] = {}
        self._bound = asyncio.Semaphore(CONFIG_READS)

    async def _read(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.client is None:
            raise LookupError("unknown cluster")
        node, kind, vmid = row.get("node"), row.get("type"), int(row["vmid"])
        if not node or kind not in ("qemu", "lxc"):
            raise LookupError(f"guest {vmid}: no node or type to read its config from")
        async with self._bound:
            config = await self.client.request("GET", f"/nodes/{quote(str(node), safe='')}/{kind}/{vmid}/config")
        if not isinstance(config, dict):
            raise ValueError(f"guest {vmid}: its config is {type(config).__name__}, not an object")
        return config

    def get(self, row: dict[str, Any]) -> asyncio.Task[dict[str, Any]]:
        vmid = int(row["vmid"])
        if vmid not in self._reads:
            self._reads[vmid] = asyncio.ensure_future(self._read(row))
        return self._reads[vmid]

    async def sizes(self, rows: list[dict[str, Any]], nodes: dict[str, Any]) -> list[tuple[int, int, int]]:
        """(cores, memory MiB, disk bytes) of each guest, from its config; raises (an
        ExceptionGroup: the reads still under way are cancelled) when any cannot be read or sized."""

        async def one(row: dict[str, Any]) -> tuple[int, int, int]:
            return size_parts(row.get("type"), await self.get(row), _node_cpus(nodes, row.get("node")))

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(row)) for row in rows]
        return [t.result() for t in tasks]


class TargetResolver:
    def __init__(
        self,
        clients: dict[str, PveApiClient],
        ttl: float = 5.0,
        version_ttl: float = 300.0,
        pools_ttl: float = 60.0,
    ) -> None:
        self.clients = clients
        self.ttl = ttl
        self.version_ttl = version_ttl  # a cluster changes release only by an upgrade
        self.pools_ttl = pools_ttl  # the token's own ACLs: changed by an administrator, rarely
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._releases: dict[str, tuple[float, tuple[int, ...]]] = {}
        # cluster -> (read at, the pools /cluster/resources listed then, whether every pool is seen)
        self._pool_sight: dict[str, tuple[float, frozenset[str], bool]] = {}
        self._pool_sight_locks: dict[str, asyncio.Lock] = {}

    async def pve_release(self, cluster: str) -> tuple[tuple[int, ...] | None, str]:
        """The cluster's PVE release (major, minor) from GET /version, cached for `version_ttl`;
        (None, why) when it cannot be learned (a failure is not cached: the next call asks again)."""
        hit = self._releases.get(cluster)
        if hit and time.monotonic() - hit[0] < self.version_ttl:
            return hit[1], ""
        client = self.clients.get(cluster)
        if client is None:
            return None, f"unknown cluster {cluster}"
        try:
            info = await client.request("GET", "/version")
            release = parse_release(str((info or {}).get("release") or (info or {}).get("version") or ""))
        except ToolError as exc:
            return None, str(exc)
        except (ValueError, AttributeError):
            return None, "its /version answer names no release"
        self._releases[cluster] = (time.monotonic(), release)
        return release, ""

    async def version_refusal(self, tool: Tool, cluster: str) -> tuple[str, str] | None:
        """(outcome, reason) when a tool that declares its PVE releases may not run on this
        cluster: another release ("unsupported_version"), or one not known ("version_unknown")."""
        if not tool.pve_versions:
            return None
        release, why = await self.pve_release(cluster)
        if release is None:
            return "version_unknown", (
                f"{tool.name} works on {tool.versions_text()} only, and the Proxmox VE version of cluster "
                f"{cluster} is not known ({why}); refusing rather than guessing"
            )
        if not tool.supports(release):
            have = ".".join(str(n) for n in release)
            return "unsupported_version", (
                f"{tool.name} works on {tool.versions_text()} only; cluster {cluster} runs PVE {have}"
            )
        return None

    async def _index(self, cluster: str, fresh: bool = False) -> dict[str, Any]:
        now = time.monotonic()
        hit = self._cache.get(cluster)
        if hit and not fresh and now - hit[0] < self.ttl:
            return hit[1]
        lock = self._locks.setdefault(cluster, asyncio.Lock())
        async with lock:
            hit = self._cache.get(cluster)
            if hit and not fresh and time.monotonic() - hit[0] < self.ttl:
                return hit[1]
            rows = await self.clients[cluster].request("GET", "/cluster/resources")
            index: dict[str, Any] = {"guests": {}, "nodes": {}}
            pools: set[str] = set()  # the pools the token may see (Proxmox lists one only with Pool.Audit)
            for row in rows or []:
                if row.get("type") in ("qemu", "lxc") and "vmid" in row:
                    index["guests"][int(row["vmid"])] = row
                elif row.get("type") == "node":
                    index["nodes"][row.get("node")] = row
                elif row.get("type") == "pool":
                    pools.add(str(row.get("pool")))
            index["pools"] = frozenset(pools)
            self._cache[cluster] = (time.monotonic(), index)
            return index

    async def _sees_every_pool(self, cluster: str, index: dict[str, Any]) -> bool:
        """Whether the cluster's token sees every pool (sees_every_pool), from its own effective
        privileges (GET /access/permissions: any token may read its own). Cached for `pools_ttl`,
        and while the pools /cluster/resources lists stay the ones it listed then: a Pool.Audit
        granted or taken away shows a pool or hides it there, and is read afresh. A failed read is
        not known: no pool is taken to be seen (not cached: the next call asks again)."""
        listed: frozenset[str] = index.get("pools", frozenset())
        hit = self._pool_sight.get(cluster)
        if hit and hit[1] == listed and time.monotonic() - hit[0] < self.pools_ttl:
            return hit[2]
        client = self.clients.get(cluster)
        if client is None:
            return False
        async with self._pool_sight_locks.setdefault(cluster, asyncio.Lock()):
            hit = self._pool_sight.get(cluster)
            if hit and hit[1] == listed and time.monotonic() - hit[0] < self.pools_ttl:
                return hit[2]
            try:
                every = sees_every_pool(await client.request("GET", "/access/permissions"))
            except Exception:  # not known: a guest listed without a pool may be in one it cannot see
                return False
            self._pool_sight[cluster] = (time.monotonic(), listed, every)
            return every

    async def _pool_known(self, cluster: str, index: dict[str, Any], row: dict[str, Any]) -> bool:
        """Whether a listed guest's row tells its pool: it names one, or it names none and the token
        sees every pool (Proxmox deletes the field from a row whose pool the token may not audit:
        without Pool.Audit a guest in pool sandbox is listed as a guest in none). Only a row
        without a pool asks, so a call on a guest whose pool is shown costs no read."""
        return row.get("pool") is not None or await self._sees_every_pool(cluster, index)

    async def guest(self, cluster: str, vmid: int) -> dict[str, Any] | None:
        """The /cluster/resources row of a guest (node, type, ...), or None if not visible."""
        row = (await self._index(cluster))["guests"].get(int(vmid))
        return dict(row) if row is not None else None

    async def nodes(self, cluster: str) -> dict[str, dict[str, Any]]:
        """Node name -> its /cluster/resources row (status online|offline|unknown)."""
        return dict((await self._index(cluster))["nodes"])

    def invalidate(self, cluster: str) -> None:
        self._cache.pop(cluster, None)

    async def resolve(self, tool: Tool, arguments: dict[str, Any], cluster: str) -> dict[str, Any]:
        """What the call names, as the policy sees it; with `destination` for a tool that puts a
        guest somewhere (a clone, a migration), so a binding's scope must cover both ends."""
        target = await self._resolve(tool, arguments, cluster)
        if tool.destination:
            target["destination"] = destination(tool, arguments, target)
        archive_param = tool.target.get("backup_of")
        if archive_param:
            target["backup_of"] = await self._backed_up(arguments.get(archive_param), cluster)
            if tool.target.get("vmid") and target.get("type") == "lxc" and target.get("known"):
                # a restore over a container: Proxmox takes its privilege from the backup
                await self._privileges(target, arguments.get(archive_param), cluster)
        volume_param = tool.target.get("volume_of")
        if volume_param:
            target["volume_of"] = await self._volume_owner(arguments.get(volume_param), cluster)
        prune_param = tool.target.get("prune")
        if prune_param:
            target["prune_removes"] = await self._prune_removes(tool, arguments, cluster, prune_param)
        members_param = tool.target.get("members")
        if members_param:
            target["members"] = await self._members(arguments.get(members_param), cluster)
            if _members_beyond_the_list(tool, arguments):
                target["members"] = {"known": False, "guests": []}
        on_node = tool.target.get("members_on_node")
        if on_node:
            target["members"] = await self._guests_on(arguments.get(on_node), cluster)
        if tool.backup_job:
            await self._backup_job(tool.backup_job, arguments, cluster, target)
        if tool.slot:
            target["slot"] = await self._slot(tool.slot, arguments, cluster, target)
        return target

    async def _slot(
        self, slot: dict[str, str], arguments: dict[str, Any], cluster: str, target: dict[str, Any]
    ) -> dict[str, Any]:
        """The config key a new disk or mount point would take (scsi3, mp0) and whether the guest's
        config holds it now, current or pending (GET .../pending lists both): Proxmox does not refuse
        a key in use, it replaces the disk there (the old one is kept as unusedN, unplugged from a
        running VM), which is a detach. `in_use` null when it could not be read."""
        out: dict[str, Any] = {"name": f"{slot['key']}{arguments.get(slot['index'])}", "in_use": None}
        node, kind, vmid = target.get("node"), target.get("type"), target.get("vmid")
        if not node or kind not in ("qemu", "lxc") or vmid is None or cluster not in self.clients:
            return out
        try:
            rows = await self.clients[cluster].request(
                "GET", f"/nodes/{quote(str(node), safe='')}/{kind}/{int(vmid)}/pending"
            )
        except Exception:  # unknown: the policy refuses what it cannot check
            return out
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return out
        out["in_use"] = any(
            r.get("key") == out["name"] and (r.get("value") is not None or r.get("pending") is not None) for r in rows
        )
        return out

    async def _prune_removes(
        self, tool: Tool, arguments: dict[str, Any], cluster: str, keep_param: str
    ) -> dict[str, Any]:
        """The guests whose backups a prune would delete, as Proxmox's own preview marks them now
        (GET .../prunebackups with the call's retention and guest), each as the cluster knows it
        (node, pool, tags; `exists` false for a guest gone from the whole cluster): without a guest
        named, a prune reaches every guest's backups on the storage, a protected one's too. `known`
        false when the preview or the guests could not be read, or a guest is hidden from the token:
        the policy refuses what it cannot check."""
        out: dict[str, Any] = {"known": False, "guests": []}
        node, storage = arguments.get(tool.target.get("node", "")), arguments.get(tool.target.get("storage", ""))
        if not node or not storage or cluster not in self.clients:
            return out
        params = {"prune-backups": str(arguments.get(keep_param, ""))}
        vmid_param = tool.target.get("vmid")
        if vmid_param and arguments.get(vmid_param) is not None:
            params["vmid"] = str(arguments[vmid_param])
        try:
            marks = await self.clients[cluster].request(
                "GET",
                f"/nodes/{quote(str(node), safe='')}/storage/{quote(str(storage), safe='')}/prunebackups",
                params=params,
            )
            index = await self._index(cluster, fresh=True)
            removed: set[int] = set()
            for row in marks if isinstance(marks, list) else [None]:
                if not isinstance(row, dict):  # not the shape Proxmox answers: nothing can be checked
                    return out
                if row.get("mark") != "remove":
                    continue
                vmid = row.get("vmid") if isinstance(row.get("vmid"), int) else backup_vmid(row.get("volid"))
                if vmid is None:  # a backup Proxmox removes without saying whose: nothing can be checked
                    return out
                removed.add(int(vmid))
            guests = [await self._listed_guest(cluster, index, vmid) for vmid in sorted(removed)]
            if any(g["exists"] is None for g in guests):
                return out  # a guest hidden from the token (no VM.Audit): its tags are not known
        except Exception:  # unknown facts: the policy refuses a prune it cannot check
            return out
        out["guests"] = guests
        out["known"] = True
        return out

    async def _members(self, vmids: Any, cluster: str) -> dict[str, Any]:
        """The guests a call names in a member list (`vmids`, comma-separated: member_ids), each as
        the cluster knows it now, as a prune's: the guests a pool membership change moves (out of
        their pool), an HA rule places, a backup job backs up, a replication job copies. A
        binding's scope must cover where each is. `known` false when the guests could not be read
        or an item names none: the policy refuses what it cannot check."""
        try:
            ids = member_ids(vmids)
        except ValueError:  # a member that names no guest the gateway can tell: not known
            return {"known": False, "guests": []}
        out: dict[str, Any] = {"known": not ids, "guests": []}
        if not ids or cluster not in self.clients:
            return out
        try:
            index = await self._index(cluster, fresh=True)
            guests = [await self._listed_guest(cluster, index, vmid) for vmid in ids]
        except Exception:  # unknown facts: the policy refuses a move it cannot check
            return out
        if not all(g["exists"] for g in guests):
            # hidden from the token (its pool and tags are not known), or no guest yet: Proxmox takes an
            # id a backup job or an ACL names before the guest exists, and places it where it is made
            return out
        out["guests"] = guests
        out["known"] = True
        return out

    async def _backup_job(
        self, spec: dict[str, str], arguments: dict[str, Any], cluster: str, target: dict[str, Any]
    ) -> None:
        """What a call changing a backup job reaches (target key backup_job). Without a new selection
        (vmids, pool) the job's saved one stays: its guest ids are target.members, a pool's or every
        guest's not known (guests joining later are backed up too), as a new job's.

        A job's retention is a prune that runs unattended after each run, on each of its guests'
        backups on its storage (vzdump; without a retention of its own, the storage's). A call that
        sets a retention deleting backups (keep), or points a job that prunes at other guests or
        another storage, has target.prune_removes: the guests whose backups the job's runs then
        prune, as the cluster knows them now, so the protected-guest check of a prune and every
        scoped deny hold on them. `known` false when the job, its storage or the guests could not
        be read: the policy refuses what it cannot check."""

        def given(key: str) -> bool:
            return key in spec and arguments.get(spec[key]) not in (None, "")

        job = await self._job(cluster, arguments.get(spec["id"]))
        if "vmids" in spec and not given("vmids") and not given("pool"):
            saved = str(job.get("vmid") or "") if job is not None and not _job_beyond_its_ids(job) else ""
            target["members"] = await self._members(saved, cluster) if saved else {"known": False, "guests": []}
        if given("keep"):
            keep = arguments[spec["keep"]]
            target["prune_removes"] = (
                {"known": True, "guests": []} if _keeps_all(keep) else await self._job_guests(cluster, job)
            )
            return
        if given("keep_all") and arguments[spec["keep_all"]] is True:
            return  # the job keeps every backup from now on: it prunes none
        # a disabled job set to run again prunes again (a job that cannot be read: its state is not known)
        resumed = given("enabled") and arguments[spec["enabled"]] is True and not _job_enabled(job)
        if not (given("vmids") or given("pool") or given("storage") or resumed):
            return  # the same guests on the same storage: no backup the job did not already prune
        storage = arguments[spec["storage"]] if given("storage") else (job or {}).get("storage")
        prunes = await self._job_prunes(cluster, job, storage)
        if prunes is False:
            return
        unknown: dict[str, Any] = {"known": False, "guests": []}
        if prunes is None:
            target["prune_removes"] = unknown
        elif given("vmids"):
            target["prune_removes"] = await self._members(arguments[spec["vmids"]], cluster)
        elif given("pool"):
            target["prune_removes"] = await self._pool_guests(cluster, arguments[spec["pool"]])
        else:
            target["prune_removes"] = await self._job_guests(cluster, job)

    async def _job(self, cluster: str, jid: Any) -> dict[str, Any] | None:
        """The backup job as Proxmox has it saved (GET /cluster/backup/{id}); None when unreadable."""
        if not isinstance(jid, str) or not jid or cluster not in self.clients:
            return None
        try:
            job = await self.clients[cluster].request("GET", f"/cluster/backup/{quote(jid, safe='')}")
        except Exception:  # unknown: what depends on it is not known
            return None
        return job if isinstance(job, dict) else None

    async def _job_guests(self, cluster: str, job: dict[str, Any] | None) -> dict[str, Any]:
        """The guests a saved job backs up now, as Proxmox selects them (its ids, its pool's guests,
        every guest but the excluded ones: GET /cluster/backup/{id}/included_volumes)."""
        unknown: dict[str, Any] = {"known": False, "guests": []}
        if job is None or not isinstance(job.get("id"), str):
            return unknown
        try:
            answer = await self.clients[cluster].request(
                "GET", f"/cluster/backup/{quote(job['id'], safe='')}/included_volumes"
            )
            rows = answer.get("children") if isinstance(answer, dict) else None
            ids = [r.get("id") for r in rows if isinstance(r, dict)] if isinstance(rows, list) else [None]
            if not all(isinstance(v, int) for v in ids) or len(ids) != len(rows or []):
                return unknown  # not the shape Proxmox answers: nothing can be checked
        except Exception:  # unknown facts: the policy refuses what it cannot check
            return unknown
        return await self._members(",".join(str(v) for v in ids), cluster)

    async def _pool_guests(self, cluster: str, pool: Any) -> dict[str, Any]:
        """A pool's guests now, as GET /pools?poolid= lists them (guests hidden from the token too)."""
        try:
            answer = await self.clients[cluster].request("GET", "/pools", params={"poolid": str(pool)})
            entry = next((p for p in answer or [] if isinstance(p, dict) and p.get("poolid") == pool), None)
            members = entry.get("members") if entry is not None else None
            if not isinstance(members, list):
                return {"known": False, "guests": []}
            ids = [m.get("vmid") for m in members if isinstance(m, dict) and m.get("type") in ("qemu", "lxc")]
            if not all(isinstance(v, int) for v in ids):
                return {"known": False, "guests": []}
        except Exception:  # unknown facts: the policy refuses what it cannot check
            return {"known": False, "guests": []}
        return await self._members(",".join(str(v) for v in ids), cluster)

    async def _job_prunes(self, cluster: str, job: dict[str, Any] | None, storage: Any) -> bool | None:
        """Whether the job's runs delete backups, as vzdump settles a run's retention (PVE::VZDump
        `new`): the job's own prune-backups (Proxmox answers it decoded, an object); else its legacy
        `maxfiles` (keep-last=N; 0 keeps all); else its storage's; else, on each node the job runs on
        (its `node`, or every node), that node's /etc/vzdump.conf, whose prune-backups or maxfiles
        prunes although the storage sets no retention (GET /nodes/{node}/vzdump/defaults answers the
        retention that applies there). Not when the job is set not to prune (remove 0). None when
        any of it cannot be read: a node not read (offline too) is not one that keeps every backup."""
        if job is None:
            return None
        if str(job.get("remove", 1)).lower() in ("0", "false"):
            return False
        own = job.get("prune-backups")
        if own not in (None, "", {}):
            return not _keeps_all(own)
        maxfiles = job.get("maxfiles")
        if maxfiles not in (None, ""):  # vzdump: { 'keep-last' => $maxfiles }, keep-all for 0
            return int(maxfiles) != 0 if str(maxfiles).isdigit() else None
        if not isinstance(storage, str) or not storage or cluster not in self.clients:
            return None
        client = self.clients[cluster]
        try:
            config = await client.request("GET", f"/storage/{quote(storage, safe='')}")
            if not isinstance(config, dict):
                return None
            theirs = config.get("prune-backups")
            if theirs not in (None, "", {}):
                return not _keeps_all(theirs)
            nodes = [job["node"]] if job.get("node") else sorted((await self._index(cluster, fresh=True))["nodes"])
            prunes = False
            for node in nodes or [None]:
                if not isinstance(node, str) or not node:
                    return None
                defaults = await client.request(
                    "GET", f"/nodes/{quote(node, safe='')}/vzdump/defaults", params={"storage": storage}
                )
                theirs = defaults.get("prune-backups") if isinstance(defaults, dict) else None
                if theirs in (None, "", {}):  # Proxmox always answers one (keep-all=1 by default)
                    return None
                prunes = prunes or not _keeps_all(theirs)
        except Exception:  # unknown: the policy refuses what it cannot check
            return None
        return prunes

    async def _guests_on(self, node: Any, cluster: str) -> dict[str, Any]:
        """Every guest on `node`, as target.members: a node's reboot or shutdown stops them all, so a
        deny covering one of them holds. `known` false when the guests could not be read."""
        out: dict[str, Any] = {"known": False, "guests": []}
        if not node or cluster not in self.clients:
            return out
        try:
            index = await self._index(cluster, fresh=True)
            on = sorted(int(v) for v, row in index["guests"].items() if row.get("node") == node)
            out["guests"] = [await self._listed_guest(cluster, index, vmid) for vmid in on]
        except Exception:  # unknown facts: the policy refuses what it cannot check
            return out
        out["known"] = True
        return out

    async def _listed_guest(self, cluster: str, index: dict[str, Any], vmid: int) -> dict[str, Any]:
        """A guest a call reaches besides its target, as the cluster's resources list it: `exists`
        false for an id no guest of the cluster has (no node, pool or tags), null for one the token
        may not see (listed only with VM.Audit: its pool and tags are not known)."""
        row = index["guests"].get(vmid)
        guest: dict[str, Any] = {"vmid": vmid, "node": None, "pool": None, "pool_known": True, "tags": []}
        guest["exists"] = row is not None
        if row is None and not await self._id_unused(cluster, vmid):
            guest.update(exists=None, pool_known=False)
        if row is not None:
            guest.update(node=row.get("node"), pool=row.get("pool"), tags=tag_list(row.get("tags")))
            guest["pool_known"] = await self._pool_known(cluster, index, row)
        return guest

    async def _privileges(self, target: dict[str, Any], archive: Any, cluster: str) -> None:
        """Whether the container a restore replaces is privileged now (target.privileged) and whether
        the backup's is (target.backup_of.privileged): Proxmox restores a container with the backup's
        `unprivileged` unless the call sets it, so another container's privileged backup restored over
        an unprivileged one makes it privileged (root in it is root on the node). A container's config
        without `unprivileged: 1` is privileged. Each null when it could not be read."""
        target["privileged"], target["backup_of"]["privileged"] = None, None
        node, vmid = target.get("node"), target.get("vmid")
        if not node or vmid is None or cluster not in self.clients:
            return
        client, at = self.clients[cluster], f"/nodes/{quote(str(node), safe='')}"
        with contextlib.suppress(Exception):  # unknown: the policy refuses what it cannot check
            current = await client.request("GET", f"{at}/lxc/{int(vmid)}/config")
            if isinstance(current, dict):
                target["privileged"] = str(current.get("unprivileged", "0")) not in ("1", "true")
        with contextlib.suppress(Exception):
            text = await client.request("GET", f"{at}/vzdump/extractconfig", params={"volume": str(archive)})
            target["backup_of"]["privileged"] = config_text(text).get("unprivileged", "0") not in ("1", "true")

    async def _volume_owner(self, volume: Any, cluster: str) -> dict[str, Any]:
        """The guest a volume belongs to, as its name says (volume_owner) and the cluster knows
        it now: a fresh lookup, so a guest tagged protected a moment ago counts. `exists` true
        (node, pool, tags filled), false (no such guest in the whole cluster: an orphan), null
        when not known (the name says no owner, or not which one, the guest is hidden from the
        token, or the lookup failed): the policy refuses to
        destroy a guest's volume whose owner it cannot check."""
        owner = volume_owner(volume)
        out: dict[str, Any] = {
            "cluster": cluster,
            "volume": volume if isinstance(volume, str) else None,
            "content": owner[0] if owner else None,
            "vmid": owner[1] if owner else None,
            "node": None,
            "pool": None,
            # a guest's volume whose owner is not known (its name ambiguous, the lookup failed) may be a
            # fenced pool's: not known, so a pool-scoped deny holds; nobody's (no owner in its name): in no pool
            "pool_known": owner is None,
            "tags": [],
            "exists": None,
        }
        if out["vmid"] is None or cluster not in self.clients:
            return out
        try:
            index = await self._index(cluster, fresh=True)
            row = index["guests"].get(out["vmid"])
            if row is None and not await self._id_unused(cluster, out["vmid"]):
                # listed only with VM.Audit, while Proxmox deletes a disk with Datastore.Allocate alone:
                # a guest the token cannot see is no orphan; its pool and tags are not known
                return out
        except Exception:  # unknown facts: the policy refuses to destroy what it cannot check
            return out
        out["exists"] = row is not None
        out["pool_known"] = True  # an orphan's (no such guest) is in no pool; a listed guest's, below
        if row is not None:
            out.update(node=row.get("node"), pool=row.get("pool"), tags=tag_list(row.get("tags")))
            out["pool_known"] = await self._pool_known(cluster, index, row)
        return out

    async def _id_unused(self, cluster: str, vmid: int) -> bool:
        """Whether no guest of the whole cluster has the id: GET /cluster/nextid?vmid= answers from
        the cluster's guest list, whatever the token may see (PVE: user => 'all'), the id itself
        when free and an error when in use. Anything else, or an error: not known to be free."""
        answer = await self.clients[cluster].request("GET", "/cluster/nextid", params={"vmid": str(vmid)})
        return str(answer) == str(vmid)

    async def _backed_up(self, volume: Any, cluster: str) -> dict[str, Any]:
        """The guest a backup volume was taken of, as the cluster knows it now: a restore copies it,
        so a binding must cover it as it covers a clone's source. Gone (or unreadable): node, pool
        and tags unknown, which a scoped binding does not cover; its pool is not known (pool_known
        false, not "in no pool"): it may have been in a pool a deny fences, which then holds."""
        vmid = backup_vmid(volume)
        out: dict[str, Any] = {
            "cluster": cluster,
            "node": None,
            "vmid": vmid,
            "pool": None,
            "pool_known": False,
            "tags": [],
        }
        if vmid is None or cluster not in self.clients:
            return out
        try:
            index = await self._index(cluster, fresh=True)
            row = index["guests"].get(vmid)
        except Exception:  # unknown facts: the policy decides what that means (a scope does not cover it)
            return out
        if row is not None:
            out.update(node=row.get("node"), pool=row.get("pool"), tags=tag_list(row.get("tags")))
            out["pool_known"] = await self._pool_known(cluster, index, row)
        return out

    async def _resolve(self, tool: Tool, arguments: dict[str, Any], cluster: str) -> dict[str, Any]:
        target = unknown_target(cluster)
        vmid_param = tool.target.get("vmid")
        node_param = tool.target.get("node")
        storage_param = tool.target.get("storage")
        if storage_param and storage_param in arguments:
            target["storage"] = arguments[storage_param]
        url_param = tool.target.get("url")
        if url_param:  # the policy allow-lists hosts: hand it the parsed host, never make Rego parse URLs
            target["url_host"] = url_host(arguments.get(url_param))
        if "upid" in arguments and "upid" in (tool.parameters.get("properties") or {}):
            # a task's call acts on the node its UPID names (PveApiRuntime.locate): a deny scoped to
            # that node holds on it, a grant scoped to nodes covers only that node's tasks
            with contextlib.suppress(ToolError):
                target["node"] = upid_node(str(arguments["upid"]))
        if not (vmid_param in arguments or node_param in arguments) or cluster not in self.clients:
            return target
        try:
            # A mutation is decided on facts read now, not up to `ttl` old: a guest tagged
            # protected (or moved out of a pool) in Proxmox a moment ago must not be
            # destroyed on the strength of the cached tags. Reads keep the cache.
            index = await self._index(cluster, fresh=tool.effect != "read")
        except UpstreamError:
            raise  # Proxmox could not be asked at all: that is the answer, not an unknown target
        except Exception:  # another failed lookup (a 500, a timeout): unknown, but not unnamed
            return unresolved(tool, arguments, target)
        new_param = tool.target.get("new_vmid")
        if new_param and new_param in arguments and int(arguments[new_param]) not in index["guests"]:
            # a create: the target is the guest-to-be, on the node and in the pool the call names
            node = arguments.get(node_param) if node_param else None
            pool_param = tool.target.get("pool")
            target.update(
                node=node,
                vmid=int(arguments[new_param]),
                type="lxc" if str(tool.spec.get("path", "")).endswith("/lxc") else "qemu",
                tags=tag_list(arguments.get("tags")),
                pool=arguments.get(pool_param) if pool_param else None,
                known=node in index["nodes"],
            )
            return target
        vmid_param = vmid_param or new_param  # an id already in use: decide on the guest that has it
        if vmid_param and vmid_param in arguments:
            row = index["guests"].get(int(arguments[vmid_param]))
            if row is None:
                return target
            target.update(
                node=row.get("node"),
                vmid=int(row["vmid"]),
                type=row.get("type"),
                name=row.get("name"),
                tags=tag_list(row.get("tags")),
                pool=row.get("pool"),
                pool_known=await self._pool_known(cluster, index, row),
                status=row.get("status"),
                ha_state=(row.get("hastate") or None),
                known=True,
            )
            path = str(tool.spec.get("path", ""))
            if node_param and node_param in arguments and f"{{{node_param}}}" in path and not tool.spec.get("locate"):
                # the request runs on the node the call names (a guest's backups on another node's
                # storage), not necessarily the guest's: a node scope must cover where it runs
                target["node"] = arguments[node_param]
        elif node_param and node_param in arguments:
            row = index["nodes"].get(arguments[node_param])
            target.update(node=arguments[node_param], status=(row or {}).get("status"), known=row is not None)
        return target

    async def resources(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        cluster: str,
        target: dict[str, Any],
        hold: TakeHold | None = None,
    ) -> dict[str, Any] | None:
        """What an allocating call asks for, and what its pool already holds (facts for the
        policy's resource quotas); None for a tool that allocates nothing.

        With `hold` (a call that may be sent), the call holds what it asks for on its pool before
        the pool's usage is read, and what the holds taken before it add (allowed calls still in
        flight, on any replica: store/holds.py) is counted into `pool_usage` and shown as
        `pool_in_flight`. The usage is then read afresh: a call whose hold was given back before
        this one's was taken has its guest listed by then.

        Guests are sized from their configurations (GET /nodes/{node}/{type}/{vmid}/config),
        counted as a create counts its arguments: every disk by its recorded size, a
        container's memory plus its swap. /cluster/resources' maxdisk is the boot disk only,
        its maxmem has no swap, and pvestatd fills maxcpu/maxmem/maxdisk seconds after a create
        or resize: none of them is counted.

        `pool_known` is false when the pool is the target guest's and Proxmox hides it from the
        token (no Pool.Audit on it: the guest is listed as in no pool): the policy refuses what a
        quota on pools would check.

        `pool_usage` is null when the call names no pool or the pool could not be summed (a
        member's config unreadable or a size in it unknown): the policy refuses what it cannot
        check against a pool limit. A call that resizes an existing guest (`resize_of`) also
        carries `final`, the sizes it sets as the guest ends up with them (null when they could
        not be worked out: the policy refuses). A restore (`copy_of_backup`) asks for the size
        its backup records, a clone (`copy_of`) for its source's size; when that cannot be
        read, `final` is null for it too: what cannot be counted is refused."""
        a = tool.allocates
        if not a:
            return None

        def qty(q: Any) -> int:
            if isinstance(q, int):
                return q
            # validation filled in every parameter default (it is sent too); the catalog lets a
            # parameter without one be counted only with `default: 0`: absent, nothing is sent
            return int(arguments.get(q["param"], q.get("default", 0)))

        def total(q: Any) -> int:  # memory_mib and disk_gib may list several quantities: summed
            return sum(qty(x) for x in q) if isinstance(q, list) else qty(q)

        requested = {
            "guests": int(a.get("guests", 0)),
            "cores": qty(a.get("cores", 0)) * (qty(a["sockets"]) if "sockets" in a else 1),
            "memory_mib": total(a.get("memory_mib", 0)),
            "disk_gib": total(a.get("disk_gib", [])),
        }
        pool_param = a.get("pool")
        pool = arguments.get(pool_param) if pool_param else target.get("pool")
        # a pool the call names is known (none given: no pool); the target's, as far as its row tells it
        pool_known = True if pool_param else bool(target.get("pool_known", True))
        facts: dict[str, Any] = {}
        configs = _Configs(self.clients.get(cluster))  # one read of each guest's config per call
        if "resize_of" in a:
            try:
                requested, facts["final"] = await self._resize(tool, arguments, cluster, target, configs)
            except Exception:  # the guest's size is unknown: so is what the call makes of it; the policy refuses
                facts["final"] = None
        elif "copy_of_backup" in a:  # a restore to a new guest asks for what its backup holds
            try:
                requested.update(await self._backup_size(tool, arguments, cluster, target))
            except Exception:  # the backup's size is unknown: the policy refuses (final null)
                facts["final"] = None
        elif "members_of" in a:  # guests put into a pool: what they hold is the pool's now
            try:
                joining = arguments.get(a["members_of"])
                requested, facts["final"] = await self._members_size(joining, pool, cluster, configs)
            except Exception:  # a guest that cannot be seen or sized: the policy refuses (final null)
                facts["final"] = None
        elif "copy_of" in a:  # a clone asks for what its source has, every disk included
            try:
                requested.update(await self._clone_size(arguments[a["copy_of"]], cluster, target, configs))
            except Exception:  # the source's size is unknown: the policy refuses (final null)
                facts["final"] = None
        usage: dict[str, int] | None = None
        if pool and hold is not None and isinstance(pool, str):
            # a store error here refuses the call (fail closed): nothing is decided without the holds
            in_flight = await hold(cluster, pool, requested)
            facts["pool_in_flight"] = in_flight
        if pool:
            try:
                usage = await self._pool_usage(pool, cluster, configs, fresh=hold is not None)
            except Exception:  # unknown usage: the policy decides (it refuses pool limits it cannot check)
                usage = None
        if usage is not None and "pool_in_flight" in facts:
            usage = {k: v + facts["pool_in_flight"].get(k, 0) for k, v in usage.items()}
        return {"requested": requested, **facts, "pool": pool, "pool_known": pool_known, "pool_usage": usage}

    async def _pool_usage(self, pool: Any, cluster: str, configs: _Configs, fresh: bool = False) -> dict[str, int]:
        """What the pool's guests hold: its members as GET /pools?poolid= lists them, each sized
        from its config (at most CONFIG_READS read at once). Raises when the members cannot be
        read (Proxmox answers 403 without Pool.Audit on /pool/<pool>) or any member cannot be
        read or sized: a pool summed without it would look emptier than it is.

        Not /cluster/resources' `pool` field: Proxmox deletes it from a guest's row unless the
        token has Pool.Audit on that pool, so a token without it would find the pool empty (a
        usage of 0, every max_pool_total passed) where this read fails and the policy refuses.
        The members' list also names guests the token cannot audit; their configs then cannot
        be read, and the usage is unknown rather than short of them."""
        answer = await self.clients[cluster].request("GET", "/pools", params={"poolid": str(pool)})
        entry = next((p for p in answer or [] if isinstance(p, dict) and p.get("poolid") == pool), None)
        if entry is None or not isinstance(entry.get("members"), list):
            raise LookupError(f"pool {pool}: its members could not be read")
        members = [m for m in entry["members"] if isinstance(m, dict) and m.get("type") in ("qemu", "lxc")]
        if any("vmid" not in m for m in members):
            raise LookupError(f"pool {pool}: a guest member without a vmid")
        index = await self._index(cluster, fresh=fresh)
        return _summed(await configs.sizes(members, index["nodes"]))

    async def _members_size(
        self, vmids: Any, pool: Any, cluster: str, configs: _Configs
    ) -> tuple[dict[str, int], dict[str, int]]:
        """(what the pool gains, the largest guest joining it) for guests put into `pool`: each
        sized from its config as the pool's usage counts it; a guest already in the pool adds
        nothing. Raises when a guest named cannot be seen or sized (Proxmox refuses an unknown
        id too): what cannot be counted is refused."""
        ids = list(dict.fromkeys(int(v) for v in str(vmids or "").split(",") if v.strip()))
        rows = []
        if ids:
            index = await self._index(cluster, fresh=True)
            for vmid in ids:
                row = index["guests"].get(vmid)
                if row is None:
                    raise LookupError(f"guest {vmid} is not visible")
                if row.get("pool") != pool:
                    rows.append(row)
        sizes = await configs.sizes(rows, index["nodes"]) if rows else []
        cores, memory, disk = ([part[i] for part in sizes] for i in range(3))
        largest = {"cores": max(cores, default=0), "memory_mib": max(memory, default=0)}
        largest["disk_gib"] = -(-max(disk, default=0) // GiB)
        return _summed(sizes), largest

    async def _clone_size(self, vmid: Any, cluster: str, target: dict[str, Any], configs: _Configs) -> dict[str, int]:
        """The size of a clone's source, from its config, counted as a create counts it: every
        disk (a full clone copies them all; a linked one's count as the sizes the new guest
        records). A container without cores takes every core of the node the clone lands on."""
        index = await self._index(cluster)
        row = index["guests"].get(int(vmid))
        if row is None:
            raise LookupError("the source guest is not visible")
        config = await configs.get(row)
        node = (target.get("destination") or {}).get("node") or row.get("node")
        return guest_size(row.get("type"), config, _node_cpus(index["nodes"], node))

    async def _resize(
        self, tool: Tool, arguments: dict[str, Any], cluster: str, target: dict[str, Any], configs: _Configs
    ) -> tuple[dict[str, int], dict[str, int]]:
        """(growth, final) for a call that sets an existing guest's cores and/or memory to new
        absolute values, or (`copy_of_backup`: a restore in place) replaces it with a backup's
        size, its disks too. `final` holds the sizes the call sets as the guest ends up with them
        (max_per_guest caps those: a size the call leaves alone is not its to answer for);
        the growth over the current size is what the pool gains (max_pool_total; a shrink adds
        nothing). Counted as a create counts them: a VM's cores times its sockets, a
        container's memory plus its swap; the current size read from the guest's config, as
        the pool's usage counts it."""
        a = tool.allocates
        sizes = {k: q for k, q in a.items() if k in ("cores", "memory_mib")}
        sets = {k: int(arguments[q["param"]]) for k, q in sizes.items() if q["param"] in arguments}
        growth = {"guests": 0, "cores": 0, "memory_mib": 0, "disk_gib": 0}
        if not sets and "copy_of_backup" not in a:  # tags, a description, onboot: no size changes
            return growth, {}
        index = await self._index(cluster)
        row = index["guests"].get(int(arguments[a["resize_of"]]))
        if row is None:
            raise LookupError("guest not visible")
        kind = row.get("type")
        config = await configs.get(row)
        final: dict[str, int] = {}
        if "copy_of_backup" in a:
            final = await self._backup_size(tool, arguments, cluster, target)
        if "cores" in sets:
            final["cores"] = sets["cores"] * sockets_of(kind, config)
        if "memory_mib" in sets:
            final["memory_mib"] = sets["memory_mib"] + swap_of(kind, config)
        # the current size of what the call sets, as the pool's usage counts it (from the config,
        # not /cluster/resources' figures); its disks as its config records them, a volume without
        # a recorded size counted 0 (the growth only looks larger)
        current: dict[str, int] = {}
        if "cores" in final:
            current["cores"] = cores_of(kind, config, _node_cpus(index["nodes"], row.get("node")))
        if "memory_mib" in final:
            current["memory_mib"] = memory_of(config) + swap_of(kind, config)
        if "disk_gib" in final:
            current["disk_gib"] = -(-disk_bytes(kind, config, strict=False) // GiB)
        growth.update({k: max(v - current[k], 0) for k, v in final.items()})
        return growth, final

    async def _backup_size(
        self, tool: Tool, arguments: dict[str, Any], cluster: str, target: dict[str, Any]
    ) -> dict[str, int]:
        """The size of the guest a backup holds (`copy_of_backup`), counted as a create counts it:
        its configuration as the backup recorded it, read on the node the call restores on
        (GET /nodes/{node}/vzdump/extractconfig). Raises when it cannot be read or counted."""
        node_param = tool.target.get("node")
        node = (arguments.get(node_param) if node_param else None) or target.get("node")
        if not node:
            raise LookupError("no node to read the backup on")
        text = await self.clients[cluster].request(
            "GET",
            f"/nodes/{quote(str(node), safe='')}/vzdump/extractconfig",
            params={"volume": str(arguments[tool.allocates["copy_of_backup"]])},
        )
        config = config_text(text)
        kind = "lxc" if str(tool.spec.get("path", "")).endswith("/lxc") else "qemu"  # what the call creates
        cpus = None
        if kind == "lxc" and not config.get("cores"):  # it may use every core of its node
            cpus = _node_cpus((await self._index(cluster))["nodes"], node)
        return guest_size(kind, config, cpus, from_backup=True)
