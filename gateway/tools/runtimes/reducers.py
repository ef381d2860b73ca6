"""Named reducers that connectors refer to by name.

TRANSFORMS reshape one pve_api answer (pure functions). COMPOSITES combine other
read-only tools' results; they receive `sub(tool, args)`, which dispatches through
the connector runtimes and only to the tools the composite declares in `uses`.
Both only ever read: a reducer has no way to send a mutation.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gateway.core.redaction import copy_document, strip_userinfo
from gateway.tools.runtimes.base import CommandFailed, ToolError

Sub = Callable[[str, dict[str, Any]], Awaitable[Any]]
Composite = Callable[[Sub, dict[str, Any], list[str]], Awaitable[Any]]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rows(data: Any) -> list[dict[str, Any]]:
    """The list inside a tool's data (plain list, or a fan-out's {"items": [...]})."""
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        data = data["items"]
    return [r for r in data or [] if isinstance(r, dict)]


def answer_rows(data: Any) -> list[dict[str, Any]]:
    """`rows` of a Proxmox list answer (null: none), for the TRANSFORMS of list endpoints: any
    other shape (a string, a number, an object) is a ToolError, never read as an empty list
    (no guests, no storage: a check that passes on an answer it could not read)."""
    if (
        data is not None
        and not isinstance(data, list)
        and not (isinstance(data, dict) and isinstance(data.get("items"), list))
    ):
        raise ToolError(f"Proxmox answered with {type(data).__name__} where a list belongs")
    return rows(data)


def _pct(used: Any, total: Any) -> float | None:
    if isinstance(used, int | float) and isinstance(total, int | float) and total > 0:
        return round(100.0 * used / total, 1)
    return None


def _age_hours(ts: Any, now: float) -> float | None:
    return round((now - float(ts)) / 3600, 1) if isinstance(ts, int | float) and ts > 0 else None


# ---------------------------------------------------------------- transforms


def node_capacity(data: Any, args: dict[str, Any]) -> dict[str, Any]:
    d = data or {}
    cpuinfo = d.get("cpuinfo") or {}

    def space(key: str) -> dict[str, Any] | None:
        return _space(d.get(key))

    return {
        "node": args.get("node"),
        "cpu": {
            "cores": cpuinfo.get("cpus"),
            "sockets": cpuinfo.get("sockets"),
            "model": cpuinfo.get("model"),
            "usage_pct": round(100 * d["cpu"], 1) if isinstance(d.get("cpu"), int | float) else None,
        },
        "memory": space("memory"),
        "rootfs": space("rootfs"),
        "swap": space("swap"),
        "loadavg": d.get("loadavg"),
        "uptime": d.get("uptime"),
        "pveversion": d.get("pveversion"),
        "kversion": d.get("kversion"),
    }


def _space(s: Any) -> dict[str, Any] | None:
    if not isinstance(s, dict):
        return None
    return {"total": s.get("total"), "used": s.get("used"), "available": s.get("avail", s.get("free")),
            "used_pct": _pct(s.get("used"), s.get("total"))}  # fmt: skip


def _pve_version(pveversion: Any) -> str | None:
    """ "pve-manager/8.4.1/2a5fa54a8503f96d" -> "8.4.1"."""
    parts = str(pveversion or "").split("/")
    return parts[1] if len(parts) >= 2 and parts[0] == "pve-manager" else None


def nodes(data: Any, args: dict[str, Any]) -> list[dict[str, Any]]:
    """/nodes rows with each online node's root filesystem and PVE version (from its status)."""
    out = []
    for r in answer_rows(data):
        st = r.get("node_status")
        row = {k: v for k, v in r.items() if k not in ("node_status", "node_status_error", "ssl_fingerprint")}
        row["rootfs"] = _space(st.get("rootfs")) if isinstance(st, dict) else None
        row["pveversion"] = st.get("pveversion") if isinstance(st, dict) else None
        row["pve_version"] = _pve_version(row["pveversion"])
        row["kernel"] = (st.get("current-kernel") or {}).get("release") if isinstance(st, dict) else None
        if not isinstance(st, dict):
            why = str(r.get("node_status_error") or "no status")
            online = r.get("status") == "online"
            row["details_unavailable"] = why if online else f"node {r.get('status') or 'unknown'}: {why}"
        out.append(row)
    return sorted(out, key=lambda r: str(r.get("node")))


_QEMU_MODELS = {"e1000", "e1000e", "e1000-82540em", "e1000-82544gc", "e1000-82545em", "i82551", "i82557b",
                "i82559er", "ne2k_isa", "ne2k_pci", "pcnet", "rtl8139", "virtio", "vmxnet3"}  # fmt: skip


def _props(value: Any) -> dict[str, str]:
    """A PVE property string ("virtio=AA:..,bridge=vmbr0,tag=20") as a dict; a bare first item keys itself."""
    out: dict[str, str] = {}
    for part in str(value or "").split(","):
        k, sep, v = part.partition("=")
        out[k.strip()] = v.strip() if sep else ""
    return out


def _nic(key: str, value: Any, config: dict[str, Any]) -> dict[str, Any]:
    p = _props(value)
    model = next((k for k in p if k in _QEMU_MODELS), None)
    lxc = "hwaddr" in p or "name" in p
    mac = p.get("hwaddr") if lxc else (p.get(model) if model else p.get("macaddr"))
    ip = gw = ip6 = gw6 = None
    source = None
    if lxc:  # a container's address is part of its net line (static, dhcp or manual)
        ip, gw, ip6, gw6 = p.get("ip"), p.get("gw"), p.get("ip6"), p.get("gw6")
        source = "config" if (ip or ip6) else None
    else:  # a VM's address is known only through cloud-init's ipconfigN
        ci = _props(config.get("ipconfig" + key[3:])) if config.get("ipconfig" + key[3:]) else {}
        ip, gw, ip6, gw6 = ci.get("ip"), ci.get("gw"), ci.get("ip6"), ci.get("gw6")
        source = "cloud-init" if ci else None
    if ip in ("dhcp", "manual"):  # not an address: say how the address is obtained instead
        ip, source = None, ip
    if ip6 in ("dhcp", "auto", "manual"):
        ip6 = None
    tag = p.get("tag")
    return {
        "interface": key,
        "name": p.get("name"),
        "model": "veth" if lxc else (model or p.get("model")),
        "mac": mac.upper() if mac else None,
        "bridge": p.get("bridge"),
        "vlan": int(tag) if tag and tag.isdigit() else None,
        "firewall": p.get("firewall") == "1",
        "link_down": p.get("link_down") == "1",
        "ip": ip,
        "gateway": gw,
        "ip6": ip6,
        "gateway6": gw6,
        "ip_source": source,
    }


def guest_config(data: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The stored configuration, and its network interfaces broken out (model, MAC, bridge, VLAN,
    firewall; IP and gateway where cloud-init or the container config states them)."""
    config = data if isinstance(data, dict) else {}
    nets = [(k, v) for k, v in config.items() if re.fullmatch(r"net[0-9]+", k)]
    nets.sort(key=lambda kv: int(kv[0][3:]))
    return {"config": config, "networks": [_nic(k, v, config) for k, v in nets]}


def tag_list(value: Any) -> list[str]:
    """A guest's tags as a list, lower-cased, each once, in the order given: as the policy sees
    them (targets.py) and as a listing shows them, so an agent reads the tags a guard rail matches.

    Proxmox's tag list format (pve-tag-list) splits on `;`, `,` and whitespace alike: a
    config written by an older release or by hand (`tags: prod protected`) reaches
    /cluster/resources as written, and is two tags to Proxmox, so it must be two here (a
    guardrail on `protected` must see it). Proxmox compares tags without case by default (the
    datacenter tag-style `case-sensitive` is off; set through the API, tags are lower-cased,
    deduplicated and sorted: GuestHelpers::get_unique_tags), so `Protected` is `protected`."""
    text = ";".join(str(t) for t in value) if isinstance(value, list) else str(value or "")
    return list(dict.fromkeys(t.lower() for t in re.split(r"[;,\s]+", text) if t))


def guests(data: Any, args: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for r in answer_rows(data):
        if r.get("type") not in ("qemu", "lxc"):
            continue
        if args.get("node") and r.get("node") != args["node"]:
            continue
        if args.get("guest_type") and r.get("type") != args["guest_type"]:
            continue
        out.append({**r, "tags": tag_list(r.get("tags")), "template": bool(r.get("template"))})
    return sorted(out, key=lambda r: int(r.get("vmid", 0)))


def _space_reason(r: dict[str, Any]) -> str | None:
    """Why Proxmox's space figures for one storage row mean nothing, or None when they were measured."""
    if r.get("enabled", 1) == 0:
        return "storage is disabled: Proxmox does not measure it"
    if not r.get("active", 1):
        return "storage is not active on this node (not mounted or unreachable): free space cannot be measured"
    if not isinstance(r.get("avail"), int | float) or not isinstance(r.get("total"), int | float):
        return "Proxmox reported no space figures for this storage"
    return None


def storage(data: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Per node rows, plus each shared storage once. `available` is what Proxmox measured;
    null (with `space_unknown_reason`) when nothing measured it, never total - used, never a 0."""
    out = []
    for r in answer_rows(data):
        reason = _space_reason(r)
        row = {k: v for k, v in r.items() if k != "avail"}
        row["content"] = [c for c in str(r.get("content", "")).split(",") if c]
        row["available"] = r["avail"] if reason is None else None
        row["space_unknown_reason"] = reason
        if reason is not None:  # PVE sends zeros for what it did not measure: they are not "empty"
            row.update(total=None, used=None, used_fraction=None)
        out.append(row)
    out.sort(key=lambda r: (str(r.get("node")), str(r.get("storage"))))
    shared: dict[str, dict[str, Any]] = {}
    for row in out:
        if not row.get("shared"):
            continue
        sid = str(row.get("storage"))
        agg = shared.setdefault(sid, {"storage": sid, "type": row.get("type"), "content": row["content"],
                                      "nodes": [], "active_on": [], "total": None, "used": None,
                                      "available": None, "used_fraction": None,
                                      "space_unknown_reason": None})  # fmt: skip
        agg["nodes"].append(row.get("node"))
        if row["space_unknown_reason"] is None:
            agg["active_on"].append(row.get("node"))
            if agg["available"] is None:  # one storage: every node measures the same space, count it once
                agg.update({k: row.get(k) for k in ("total", "used", "available", "used_fraction")})
    for agg in shared.values():
        if agg["available"] is None:
            reasons = sorted({str(r["space_unknown_reason"]) for r in out if r.get("storage") == agg["storage"]})
            agg["space_unknown_reason"] = "no node measured it: " + "; ".join(reasons)
    return {"items": out, "shared_storages": sorted(shared.values(), key=lambda a: str(a["storage"]))}


def snapshots(data: Any, args: dict[str, Any]) -> list[dict[str, Any]]:
    now = time.time()
    out = []
    for r in answer_rows(data):
        if r.get("name") == "current":
            continue
        out.append({**r, "age_hours": _age_hours(r.get("snaptime"), now)})
    return out


def apt_repositories(data: Any, args: dict[str, Any]) -> Any:
    """The node's APT repositories without the credentials a source line may carry in its URI
    (`deb https://user:secret@repo.vendor.example/debian ...`, the way apt's own auth.conf is
    often skipped): every string of the answer, so URIs, options, comments and the parser's
    error and info messages quoting a line lose them alike. A new copy; `data` is not changed."""
    return copy_document(data, leaf=_strip_userinfo_of_text)


def _strip_userinfo_of_text(value: Any) -> Any:
    return strip_userinfo(value) if isinstance(value, str) else value


def no_userinfo(data: Any, args: dict[str, Any]) -> Any:
    """Any answer whose text may quote a URL as Proxmox was given it: a task's log lines and
    exit status (a download-url started in the web UI logs "starting file import from:
    https://user:password@mirror/...", and a failed one's status quotes it again). Every
    string loses the URLs' userinfo; a new copy."""
    return copy_document(data, leaf=_strip_userinfo_of_text)


TRANSFORMS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "node_capacity": node_capacity,
    "nodes": nodes,
    "guest_config": guest_config,
    "guests": guests,
    "storage": storage,
    "snapshots": snapshots,
    "apt_repositories": apt_repositories,
    "no_userinfo": no_userinfo,
}


# ---------------------------------------------------------------- composites


async def _gather(calls: list[Awaitable[Any]], limit: int = 8) -> list[Any]:
    """Run sub-calls with bounded concurrency; exceptions are returned, not raised."""
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[Any]) -> Any:
        async with sem:
            return await c

    try:
        return list(await asyncio.gather(*(one(c) for c in calls), return_exceptions=True))
    except asyncio.CancelledError:  # the composite's deadline: those still waiting for their turn never start
        for c in calls:
            if isinstance(c, Coroutine):
                c.close()  # no "never awaited" warning (a no-op for those that ran: all have ended by now)
        raise


def _err(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ToolError) else type(exc).__name__


async def _guest_row(sub: Sub, vmid: int) -> dict[str, Any]:
    for r in rows(await sub("list_guests", {})):
        if int(r.get("vmid", -1)) == vmid:
            return r
    raise ToolError(f"guest {vmid} not found (or the gateway's token cannot see it)")


async def _backup_volumes(
    sub: Sub, warnings: list[str], vmid: int | None, unread: list[str] | None = None
) -> list[dict[str, Any]]:
    """Backup volumes from every active storage with backup content; shared storage read once.
    `unread` gets what was not read (a storage inactive or failing, a node whose storages are not
    listed): backups there are missing from the answer."""
    unread = [] if unread is None else unread
    seen: set[str] = set()
    targets: list[tuple[str, str]] = []
    before = len(warnings)
    storages = rows(await sub("list_storage", {}))
    # list_storage's own warnings: a node offline or failing, whose storages (and backups) are not listed
    unread.extend(w.removeprefix("list_storage: ") for w in warnings[before:] if w.startswith("list_storage: "))
    for s in storages:
        if "backup" not in (s.get("content") or []):
            continue
        if not s.get("active", 1) or s.get("enabled", 1) == 0:
            warnings.append(f"storage {s.get('storage')} on {s.get('node')} is not active: its backups are not listed")
            unread.append(f"storage {s.get('storage')} on {s.get('node')} is not active")
            continue
        key = str(s["storage"]) if s.get("shared") else f"{s.get('node')}/{s.get('storage')}"
        if key not in seen:
            seen.add(key)
            targets.append((str(s["node"]), str(s["storage"])))
    args: dict[str, Any] = {"content": "backup"}
    if vmid is not None:
        args["vmid"] = vmid
    results = await _gather([sub("list_storage_content", {"node": n, "storage": st, **args}) for n, st in targets])
    now = time.time()
    out = []
    for (node, st), res in zip(targets, results, strict=True):
        if isinstance(res, BaseException):
            warnings.append(f"storage {st} on {node}: {_err(res)}")
            unread.append(f"storage {st} on {node}: {_err(res)}")
            continue
        for v in rows(res):
            if v.get("content", "backup") != "backup":
                continue
            out.append({"volid": v.get("volid"), "vmid": v.get("vmid"), "storage": st, "node": node,
                        "size": v.get("size"), "ctime": v.get("ctime"), "age_hours": _age_hours(v.get("ctime"), now),
                        "protected": bool(v.get("protected")), "format": v.get("format"),
                        "verification": (v.get("verification") or {}).get("state")})  # fmt: skip
    return out


async def list_backups(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """Every backup read, and per guest the count and newest. `complete` is false (with `reason`) when
    a storage or node was not read: a guest with none found then has count and newest null (unknown,
    not "has none"), and the others' counts are those found (a newer backup may be where nothing was read)."""
    vmid = args.get("vmid")
    unread: list[str] = []
    volumes = await _backup_volumes(sub, warnings, vmid, unread)
    try:
        guest_rows = [g for g in rows(await sub("list_guests", {})) if vmid is None or int(g["vmid"]) == vmid]
    except ToolError as exc:
        warnings.append(f"guest list: {exc}")
        guest_rows = []
    per: dict[int, dict[str, Any]] = {}
    for g in guest_rows:
        if not g.get("template"):
            per[int(g["vmid"])] = {"vmid": int(g["vmid"]), "name": g.get("name"), "count": 0,
                                   "newest_volid": None, "newest_age_hours": None}  # fmt: skip
    for v in volumes:
        if not isinstance(v.get("vmid"), int):
            continue
        p = per.setdefault(v["vmid"], {"vmid": v["vmid"], "name": None, "count": 0, "newest_volid": None,
                                       "newest_age_hours": None})  # fmt: skip
        p["count"] += 1
        if p["newest_age_hours"] is None or (v["age_hours"] is not None and v["age_hours"] < p["newest_age_hours"]):
            p["newest_volid"], p["newest_age_hours"] = v["volid"], v["age_hours"]
    reason = None
    if unread:
        for p in per.values():
            if p["count"] == 0:  # its backups may be on what was not read: unknown, never "has none"
                p["count"] = None
        reason = "not every backup storage was read: " + "; ".join(dict.fromkeys(unread))
    return {
        "items": sorted(volumes, key=lambda v: (v.get("vmid") or 0, -(v.get("ctime") or 0))),
        "per_guest": sorted(per.values(), key=lambda p: p["vmid"]),
        "complete": not unread,
        "reason": reason,
        "collected_at": now_iso(),
    }


def _ips_in_config(config: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for key, value in config.items():
        if re.fullmatch(r"(ipconfig|net)[0-9]+", key):
            found.update(re.findall(r"\bip=([0-9.]+)", str(value)))
    return found


async def check_ip_availability(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """free only when every check ran and none saw the ip; any sighting is in_use; else unknown."""
    ip = str(args["ip"])
    checks: list[dict[str, Any]] = []
    evidence: list[str] = []

    # 1. static configuration of every guest
    guest_rows = rows(await sub("list_guests", {}))
    results = await _gather([sub("get_guest_stored_config", {"vmid": int(g["vmid"])}) for g in guest_rows])
    failed = []
    configs: dict[int, dict[str, Any]] = {}
    for g, res in zip(guest_rows, results, strict=True):
        if isinstance(res, BaseException):
            failed.append(f"{g['vmid']}: {_err(res)}")
            continue
        configs[int(g["vmid"])] = (res or {}).get("config") or {}
        if ip in _ips_in_config(configs[int(g["vmid"])]):
            evidence.append(f"configured on guest {g['vmid']} ({g.get('name')})")
    checks.append({"check": "guest_configs", "complete": not failed, "errors": failed[:10]})

    # 2. the guest agent of every running VM that has one configured (or whose config could not be
    # read): an agent that does not answer is a check that did not run, so the answer cannot be "free"
    running = [g for g in guest_rows if g.get("type") == "qemu" and g.get("status") == "running"]
    agent_vms = [g for g in running if _agent_enabled(configs.get(int(g["vmid"])))]
    without = [int(g["vmid"]) for g in running if g not in agent_vms]
    results = await _gather([sub("vm_agent_network", {"vmid": int(g["vmid"])}) for g in agent_vms])
    agent_err = []
    for g, res in zip(agent_vms, results, strict=True):
        if isinstance(res, BaseException):
            agent_err.append(f"{g['vmid']}: {_err(res)}")
            continue
        ifaces = (res or {}).get("result") if isinstance(res, dict) else None
        if not isinstance(ifaces, list):  # {"result": {"error": ...}}: the agent answered nothing usable
            agent_err.append(f"{g['vmid']}: the guest agent gave no interface list")
            continue
        for iface in ifaces:
            for a in (iface.get("ip-addresses") if isinstance(iface, dict) else None) or []:
                if isinstance(a, dict) and a.get("ip-address") == ip:
                    evidence.append(f"reported by the guest agent of VM {g['vmid']} ({g.get('name')})")
    checks.append({"check": "guest_agents", "complete": not agent_err, "errors": agent_err[:10],
                   "asked": len(agent_vms), "answered": len(agent_vms) - len(agent_err),
                   "running_vms_without_agent": without})  # fmt: skip

    # 3. neighbour tables and 4. ping, from every node (an offline node means incomplete)
    nodes = rows(await sub("list_nodes", {}))
    online = [str(n["node"]) for n in nodes if n.get("status") == "online"]
    offline = [str(n["node"]) for n in nodes if n.get("status") != "online"]
    arp = await _gather([sub("node_arp_table", {"node": n}) for n in online])
    pings = await _gather([sub("node_ping", {"node": n, "ip": ip}) for n in online])
    arp_err = [f"{n}: {_err(r)}" for n, r in zip(online, arp, strict=True) if isinstance(r, BaseException)]
    ping_err = [f"{n}: {_err(r)}" for n, r in zip(online, pings, strict=True) if isinstance(r, BaseException)]
    for n, res in zip(online, arp, strict=True):
        if isinstance(res, BaseException):
            continue
        for e in res or []:
            states = e.get("state") or []
            if e.get("dst") == ip and not ({"FAILED", "INCOMPLETE"} & set(states)):
                evidence.append(f"in the neighbour table of node {n} ({e.get('lladdr')}, {'/'.join(states)})")
    for n, res in zip(online, pings, strict=True):
        if not isinstance(res, BaseException) and (res or {}).get("ok"):
            evidence.append(f"answers ping from node {n}")
    off = [f"{n}: node offline" for n in offline]
    checks.append({"check": "neighbour_tables", "complete": not (arp_err or off), "errors": arp_err + off})
    checks.append({"check": "ping", "complete": not (ping_err or off), "errors": ping_err + off})

    incomplete = [c["check"] for c in checks if not c["complete"]]
    reason = None
    if evidence:
        status = "in_use"
    elif not incomplete:
        status = "free"
    else:
        status = "unknown"
        reason = "not every check ran: " + ", ".join(incomplete) + " incomplete (see checks[].errors)"
        warnings.append("not every check could run, so the address is not reported free")
    return {"ip": ip, "status": status, "reason": reason, "evidence": evidence, "checks": checks,
            "collected_at": now_iso()}  # fmt: skip


def _agent_enabled(config: dict[str, Any] | None) -> bool:
    """QEMU `agent` is "1", "true", "fstrim_cloned_disks=1,enabled=yes", ...: `enabled` is a bare item or
    `enabled=`, anywhere, a PVE boolean (1, yes, on, true in any case); an unreadable config counts as yes."""
    if config is None:
        return True
    props = _props(config.get("agent", "0"))
    # PVE's parser gives any item without `=` to the default key, wherever it stands (`type=isa,1`)
    bare = next((k for k, v in props.items() if v == "" and k), "0")
    value = props["enabled"] if "enabled" in props else bare
    return value.lower() in ("1", "yes", "on", "true")


def _labels(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    out = {}
    for part in str(raw or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def _health(status: str) -> str | None:
    m = re.search(r"\((healthy|unhealthy|health: starting)\)", status)
    return m.group(1).replace("health: ", "") if m else None


def container_row(r: dict[str, Any]) -> dict[str, Any]:
    """One `docker ps` row, projected: never Command, Mounts or anything env-like."""
    labels = _labels(r.get("Labels"))
    return {
        "id": str(r.get("ID", ""))[:12],
        "name": r.get("Names"),
        "image": r.get("Image"),
        "state": r.get("State"),
        "status": r.get("Status"),
        "health": _health(str(r.get("Status", ""))),
        "ports": [p for p in str(r.get("Ports") or "").split(", ") if p],
        "compose_project": labels.get("com.docker.compose.project"),
        "compose_service": labels.get("com.docker.compose.service"),
    }


async def _docker_guest(sub: Sub, vmid: int, warnings: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
    """(guest row, docker ps rows) — rows is None when Docker could not be asked."""
    g = await _guest_row(sub, vmid)
    if g.get("type") != "lxc":
        warnings.append("Docker is only inspected inside LXC containers; VMs are not inspected")
        return g, None
    if g.get("status") != "running":
        warnings.append(f"container {vmid} is {g.get('status')}: Docker cannot be asked")
        return g, None
    try:
        return g, rows(await sub("lxc_docker_ps", {"vmid": vmid}))
    except CommandFailed as exc:
        if exc.exit_status == 127:
            g = {**g, "_docker_missing": True}
        else:
            warnings.append(f"docker ps: {exc}")
        return g, None
    except ToolError as exc:
        warnings.append(f"docker ps: {exc}")
        return g, None


async def list_guest_containers(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    vmid = int(args["vmid"])
    g, ps = await _docker_guest(sub, vmid, warnings)
    available: bool | None
    if ps is not None:
        available = True
    elif g.get("_docker_missing"):
        available = False
    else:
        available = None
    return {
        "vmid": vmid,
        "name": g.get("name"),
        "type": g.get("type"),
        "node": g.get("node"),
        "docker_available": available,
        "items": [container_row(r) for r in ps or []],
        "collected_at": now_iso(),
    }


# `docker inspect`s one inspect_compose_stack call runs: the guest writes the `docker ps` rows (up to
# ssh.max_output_bytes, ~20,000 of them), and each inspect is one command on the node. Beyond it a
# service is listed from its `docker ps` row alone
MAX_COMPOSE_INSPECTS = 50


async def inspect_compose_stack(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    vmid, project = int(args["vmid"]), str(args["project"])
    g, ps = await _docker_guest(sub, vmid, warnings)
    if ps is None:
        raise ToolError(f"cannot inspect Docker in guest {vmid}: " + ("; ".join(warnings) or "Docker is not installed"))
    stacks = rows(await sub("lxc_compose_ls", {"vmid": vmid}))
    stack = next((s for s in stacks if s.get("Name") == project), None)
    members = [r for r in ps if _labels(r.get("Labels")).get("com.docker.compose.project") == project]
    if stack is None and not members:
        raise ToolError(f"no Compose project {project!r} in guest {vmid}")
    by_id: dict[str, dict[str, Any]] = {}  # one service per container: a repeated row is listed and inspected once
    for r in members:
        by_id.setdefault(str(r.get("ID", ""))[:12], r)
    ids = list(by_id)[:MAX_COMPOSE_INSPECTS]
    if len(by_id) > len(ids):
        warnings.append(
            f"{len(by_id) - len(ids)} more container(s) of project {project} not inspected (at most "
            f"{MAX_COMPOSE_INSPECTS} per call): they are listed from docker ps alone, without restart policy, "
            "exit code, networks or mounts"
        )
    inspected = dict(
        zip(ids, await _gather([sub("lxc_docker_inspect", {"vmid": vmid, "container": i}) for i in ids]), strict=True)
    )
    services = []
    for cid, r in by_id.items():
        row = container_row(r)
        svc: dict[str, Any] = {"service": row["compose_service"], "container": row["name"], "image": row["image"],
                               "state": row["state"], "health": row["health"], "ports": row["ports"]}  # fmt: skip
        services.append(svc)
        if cid not in inspected:  # beyond the cap: its docker ps row only
            continue
        res = inspected[cid]
        if isinstance(res, BaseException):
            warnings.append(f"inspect {row['name']}: {_err(res)}")
        else:
            info = (rows(res) or [{}])[0]
            st = info.get("state") or {}
            svc.update(
                restart_policy=(info.get("restart") or {}).get("Name"),
                restart_count=None,
                exit_code=st.get("ExitCode"),
                started_at=st.get("StartedAt"),
                health=((st.get("Health") or {}).get("Status") or svc["health"]),
                networks=sorted((info.get("networks") or {}).keys()),
                mounts=[
                    {"source": m.get("Source"), "destination": m.get("Destination"), "type": m.get("Type")}
                    for m in info.get("mounts") or []
                ],
            )
            svc.pop("restart_count")
    return {
        "vmid": vmid,
        "node": g.get("node"),
        "project": project,
        "status": (stack or {}).get("Status"),
        "config_files": (stack or {}).get("ConfigFiles"),
        "services": sorted(services, key=lambda s: str(s.get("service"))),
        "collected_at": now_iso(),
    }


async def guest_health_summary(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """`healthy` is false when a concern was found, true only when every check ran and found none, and
    null (unknown) when a check could not run (`not_checked` says which and why) and none was found.
    Backups count as checked on what could be read: more backups can only lift a concern, never add one."""
    vmid = int(args["vmid"])
    g = await _guest_row(sub, vmid)
    concerns: list[str] = []
    not_checked: list[str] = []
    status_res, snaps_res = await _gather(
        [sub("get_guest_status", {"vmid": vmid}), sub("list_snapshots", {"vmid": vmid})]
    )
    status: dict[str, Any] = {}
    if isinstance(status_res, BaseException):
        warnings.append(f"status: {_err(status_res)}")
        not_checked.append(f"status: {_err(status_res)}")
    else:
        status = status_res or {}
    state = status.get("status") or g.get("status")
    if g.get("template"):
        concerns_state = None
    elif state != "running":
        concerns_state = f"guest is {state}"
    else:
        concerns_state = None
    if concerns_state:
        concerns.append(concerns_state)
    mem = _pct(status.get("mem", g.get("mem")), status.get("maxmem", g.get("maxmem")))
    disk = _pct(status.get("disk", g.get("disk")), status.get("maxdisk", g.get("maxdisk")))
    cpu = status.get("cpu", g.get("cpu"))
    cpu_pct = round(100 * cpu, 1) if isinstance(cpu, int | float) else None
    if state == "running":
        if mem is not None and mem >= 90:
            concerns.append(f"memory {mem}% used")
        if disk is not None and disk >= 90:
            concerns.append(f"disk {disk}% used")
        if cpu_pct is not None and cpu_pct >= 90:
            concerns.append(f"CPU {cpu_pct}% busy")
    ha = status.get("ha") if isinstance(status.get("ha"), dict) else {}
    ha_state = (ha or {}).get("state") or g.get("hastate")
    if ha_state in ("error", "fence", "recovery", "freeze"):
        concerns.append(f"HA state is {ha_state}")
    snap_summary: dict[str, Any] = {"count": None, "oldest_age_hours": None}
    if isinstance(snaps_res, BaseException):
        warnings.append(f"snapshots: {_err(snaps_res)}")
        not_checked.append(f"snapshots: {_err(snaps_res)}")
    else:
        ages = [s["age_hours"] for s in rows(snaps_res) if s.get("age_hours") is not None]
        snap_summary = {"count": len(rows(snaps_res)), "oldest_age_hours": max(ages) if ages else None}
        if ages and max(ages) > 24 * 7:
            concerns.append(f"oldest snapshot is {max(ages):.0f} h old (snapshots slow the disk and grow)")
    volumes = await _backup_volumes(sub, warnings, vmid)
    mine = [v for v in volumes if v.get("vmid") == vmid and v.get("age_hours") is not None]
    newest = min((v["age_hours"] for v in mine), default=None)
    if not g.get("template"):
        if newest is None:
            concerns.append("no backup found")
        elif newest > 48:
            concerns.append(f"newest backup is {newest:.0f} h old")
    docker: dict[str, Any] | None = None
    if g.get("type") == "lxc" and state == "running":
        dw: list[str] = []
        inspected, ps = await _docker_guest(sub, vmid, dw)
        if ps is None and not inspected.get("_docker_missing"):  # Docker could not be asked: not "no problem"
            not_checked.append("docker: " + ("; ".join(dw) or "docker ps could not run"))
        if ps is not None:
            cs = [container_row(r) for r in ps]
            bad = [c for c in cs if c["state"] != "running" or c["health"] == "unhealthy"]
            docker = {"containers": len(cs), "not_ok": [f"{c['name']} ({c['state']}, {c['health']})" for c in bad]}
            concerns.extend(f"docker container {c['name']} is {c['health'] or c['state']}" for c in bad)
        warnings.extend(w for w in dw if "only inspected" not in w)
    healthy: bool | None = not concerns
    if not concerns and not_checked:
        healthy = None
        warnings.append("not every check could run, so the guest is not reported healthy (see not_checked)")
    return {
        "vmid": vmid,
        "name": g.get("name"),
        "type": g.get("type"),
        "node": g.get("node"),
        "status": state,
        "ha_state": ha_state,
        "uptime": status.get("uptime", g.get("uptime")),
        "cpu_pct": cpu_pct,
        "mem_used_pct": mem,
        "disk_used_pct": disk,
        "snapshots": snap_summary,
        "backups": {"count": len(mine), "newest_age_hours": newest},
        "docker": docker,
        "concerns": concerns,
        "healthy": healthy,
        "not_checked": not_checked,
        "collected_at": now_iso(),
    }


def _agent_addresses(result: Any) -> dict[str, list[str]]:
    """MAC (upper case) -> the addresses (with prefix) the QEMU guest agent reports on it."""
    out: dict[str, list[str]] = {}
    ifaces = result.get("result") if isinstance(result, dict) else None
    for iface in ifaces if isinstance(ifaces, list) else []:
        if not isinstance(iface, dict) or not iface.get("hardware-address"):
            continue
        addrs = [
            f"{a.get('ip-address')}/{a.get('prefix')}" if a.get("prefix") is not None else str(a.get("ip-address"))
            for a in iface.get("ip-addresses") or []
            if isinstance(a, dict) and a.get("ip-address")
        ]
        out.setdefault(str(iface["hardware-address"]).upper(), []).extend(addrs)
    return out


async def guest_config_report(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The stored configuration with its NICs broken out; for a VM whose agent is configured, the
    addresses the agent reports are added per NIC (matched by MAC). The agent read goes through
    vm_agent_network, so the policy sees it; when it fails the answer says why, the rest stands."""
    leaf_args: dict[str, Any] = {k: args[k] for k in ("vmid", "node") if k in args}
    report = dict(await sub("get_guest_stored_config", leaf_args))
    config = report.get("config") or {}
    nets = [dict(n) for n in report.get("networks") or []]
    is_vm = not any(n.get("model") == "veth" for n in nets) and "hostname" not in config
    report["agent"] = None
    if is_vm and _agent_enabled(config):
        try:
            by_mac = _agent_addresses(await sub("vm_agent_network", {"vmid": int(args["vmid"])}))
        except ToolError as exc:
            warnings.append(f"guest agent: {exc}")
            report["agent"] = {"answered": False, "error": str(exc)}
        else:
            report["agent"] = {"answered": True, "error": None}
            for n in nets:
                found = by_mac.get(str(n.get("mac") or "").upper(), [])
                n["agent_ips"] = found
                v4 = [a for a in found if ":" not in a]
                if n.get("ip") is None and v4:
                    n["ip"], n["ip_source"] = v4[0], "agent"
    report["networks"] = nets
    return report


async def node_capacity_report(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    """The node's status figures plus every mounted filesystem (df over SSH); a missing part is null with why."""
    node = str(args["node"])
    status, fs = await _gather([sub("get_node_status", {"node": node}), sub("node_filesystems", {"node": node})])
    if isinstance(status, BaseException):
        if isinstance(fs, BaseException):
            raise ToolError(f"node {node}: status: {_err(status)}; filesystems: {_err(fs)}")
        warnings.append(f"node status: {_err(status)}")
        report: dict[str, Any] = {"node": node}
    else:
        report = dict(status)
    if isinstance(fs, BaseException):
        warnings.append(f"filesystems: {_err(fs)}")
        report["filesystems"] = None
        report["filesystems_unavailable"] = _err(fs)
    else:
        report["filesystems"] = [{**f, "used_pct": _pct(f.get("used"), f.get("total"))} for f in rows(fs)]
    report["collected_at"] = now_iso()
    return report


COMPOSITES: dict[str, Composite] = {
    "node_capacity": node_capacity_report,
    "guest_config": guest_config_report,
    "list_backups": list_backups,
    "check_ip_availability": check_ip_availability,
    "list_guest_containers": list_guest_containers,
    "inspect_compose_stack": inspect_compose_stack,
    "guest_health_summary": guest_health_summary,
}

from gateway.tools.runtimes.preflight import upgrade_preflight  # noqa: E402  (its own module: node operations)

COMPOSITES["upgrade_preflight"] = upgrade_preflight

from gateway.tools.runtimes.masking import acme_account, subscription  # noqa: E402  (certificate family)
from gateway.tools.runtimes.tasklog import task_log_tail  # noqa: E402  (task family)

TRANSFORMS.update(subscription=subscription, acme_account=acme_account)
COMPOSITES["task_log_tail"] = task_log_tail


@dataclass(frozen=True)
class ReducerFields:
    """What a TRANSFORMS reducer does to the fields of Proxmox's answer (of each row, for a list), for
    `pvegate check` (pveschema.py): an output field it adds is no typo, one it drops yields nothing."""

    adds: frozenset[str] = frozenset()
    drops: frozenset[str] = frozenset()
    replaces: bool = False  # a new answer: only `adds` exist, none of Proxmox's fields pass through


# Every TRANSFORMS reducer, declared (tests/connectors/test_output_fields.py): change it with the reducer.
REDUCER_FIELDS: dict[str, ReducerFields] = {
    "node_capacity": ReducerFields(
        adds=frozenset({"node", "cpu", "memory", "rootfs", "swap", "loadavg", "uptime", "pveversion", "kversion"}),
        replaces=True,
    ),
    "nodes": ReducerFields(
        adds=frozenset({"rootfs", "pveversion", "pve_version", "kernel", "details_unavailable"}),
        drops=frozenset({"node_status", "node_status_error", "ssl_fingerprint"}),
    ),
    "guest_config": ReducerFields(adds=frozenset({"config", "networks"}), replaces=True),
    "guests": ReducerFields(),
    "storage": ReducerFields(adds=frozenset({"available", "space_unknown_reason"}), drops=frozenset({"avail"})),
    "snapshots": ReducerFields(adds=frozenset({"age_hours"})),
    "apt_repositories": ReducerFields(),
    "no_userinfo": ReducerFields(),
    "subscription": ReducerFields(),
    "acme_account": ReducerFields(),
}
