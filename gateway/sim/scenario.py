"""Load a scenario YAML file into a `Cluster`.

The YAML is deliberately terse (sizes in MB/GB, ages in hours); this module
expands it into the full PVE-shaped config each guest would have on disk.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gateway.sim.state import (
    AclEntry,
    Cluster,
    DockerContainer,
    Guest,
    Node,
    Pool,
    Snapshot,
    Storage,
    Token,
    User,
    Volume,
)
from gateway.sim.tags import split_tags

MiB = 1 << 20
GiB = 1 << 30
SHIPPED = ("small", "default", "second")
DEFAULT_REALMS = [
    {"realm": "pam", "type": "pam", "comment": "Linux PAM standard authentication"},
    {"realm": "pve", "type": "pve", "comment": "Proxmox VE authentication server"},
]


@dataclass
class Scenario:
    cluster: Cluster
    faults: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def scenario_path(name: str | Path) -> Path:
    """A shipped scenario name or a path to a YAML file."""
    if isinstance(name, str) and name in SHIPPED:
        return Path(str(resources.files("gateway.sim") / "scenarios" / f"{name}.yaml"))
    p = Path(name)
    if not p.is_file():
        raise FileNotFoundError(f"scenario not found: {name} (shipped: {', '.join(SHIPPED)})")
    return p


def load_scenario(name: str | Path, now: float | None = None) -> Scenario:
    path = scenario_path(name)
    raw = yaml.safe_load(path.read_text())
    return Scenario(cluster=build_cluster(raw, now or time.time()), faults=raw.get("faults") or {}, source=str(path))


def _mac(vmid: int, idx: int) -> str:
    h = hashlib.sha256(f"{vmid}/{idx}".encode()).digest()
    return "BC:24:11:" + ":".join(f"{b:02X}" for b in h[:3])


def _hexid(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _acls(items: list[dict[str, Any]] | None) -> list[AclEntry]:
    out = []
    for a in items or []:
        roles = a.get("roles") or [a["role"]]
        out.append(AclEntry(path=a["path"], roles=list(roles), propagate=bool(a.get("propagate", True))))
    return out


def build_cluster(raw: dict[str, Any], now: float) -> Cluster:
    c = raw.get("cluster") or {}
    cl = Cluster(
        name=c.get("name", "sim"),
        version=str(c.get("version", "8.4.1")),
        repoid=c.get("repoid", "2a5fa54a8503f96d"),
        task_seconds=float(c.get("task_seconds", 0.3)),
        auth_failure_delay=float(c.get("auth_failure_delay", 0.0)),
        ceph=c.get("ceph"),
    )
    for i, n in enumerate(raw.get("nodes") or [], start=1):
        node = Node(
            name=n["name"],
            nodeid=i,
            ip=n.get("ip", f"10.0.0.{10 + i}"),
            online=bool(n.get("online", True)),
            maxcpu=int(n.get("maxcpu", 16)),
            maxmem=int(n.get("memory_gb", 64)) * GiB,
            mem=int(n.get("used_memory_gb", 12)) * GiB,
            maxdisk=int(n.get("rootfs_gb", 100)) * GiB,
            disk=int(n.get("rootfs_used_gb", 10)) * GiB,
            cpu_load=float(n.get("cpu", 0.05)),
            boot_time=now - float(n.get("uptime_hours", 240)) * 3600,
            level=n.get("level", ""),
        )
        node.ssl_fingerprint = ":".join(
            hashlib.sha256(node.name.encode()).hexdigest().upper()[i : i + 2] for i in range(0, 64, 2)
        )
        node.network = n.get("network") or _default_network(node)
        node.vzdump_conf = dict(n.get("vzdump_conf") or {})
        cl.nodes[node.name] = node
    for s in raw.get("storages") or []:
        total = s.get("total_gb")
        cl.storages[s["id"]] = Storage(
            id=s["id"],
            type=s["type"],
            content=list(s.get("content", [])),
            shared=bool(s.get("shared", False)),
            nodes=s.get("nodes"),
            total=int(total * GiB) if total is not None else None,
            used=int(s.get("used_gb", 0) * GiB) if total is not None else None,
            active=bool(s.get("active", True)),
            enabled=bool(s.get("enabled", True)),
            path=s.get("path"),
            server=s.get("server"),
            extra=dict(s.get("extra") or {}),
        )
    for p in raw.get("pools") or []:
        cl.pools[p["id"]] = Pool(id=p["id"], comment=p.get("comment", ""), storages=list(p.get("storages", [])))
    for g in raw.get("guests") or []:
        guest = _build_guest(g, now)
        cl.guests[guest.vmid] = guest
        if g.get("firewall"):
            cl.guest_firewall_rules[guest.vmid] = [_fw_rule(r, i) for i, r in enumerate(g["firewall"])]
    for b in raw.get("backups") or []:
        cl.volumes.append(_backup_volume(cl, b, now))
    for v in raw.get("volumes") or []:
        cl.volumes.append(Volume(**v))
    _disk_volumes(cl)
    cl.backup_jobs = [dict(j) for j in raw.get("backup_jobs") or []]
    cl.firewall_rules = [_fw_rule(r, i) for i, r in enumerate(raw.get("firewall") or [])]
    cl.ha_groups = {h["group"]: h for h in raw.get("ha_groups") or []}
    cl.roles = {k: list(v) for k, v in (raw.get("roles") or {}).items()}
    for u in raw.get("users") or []:
        cl.users[u["userid"]] = User(
            userid=u["userid"],
            acls=_acls(u.get("acls")),
            groups=u.get("groups", []),
            **{k: u[k] for k in ("email", "firstname", "lastname", "comment", "enable", "expire") if k in u},
        )
    for grp in raw.get("groups") or []:  # identity groups: members come from the users' `groups`
        cl.groups[grp["groupid"]] = _acls(grp.get("acls"))
        cl.group_comments[grp["groupid"]] = str(grp.get("comment", ""))
    cl.realms = [dict(r) for r in raw.get("realms") or DEFAULT_REALMS]
    cl.tfa = {k: [dict(e) for e in v] for k, v in (raw.get("tfa") or {}).items()}
    for t in raw.get("tokens") or []:
        tok = Token(
            name=t["name"],
            tokenid=t["tokenid"],
            secret=str(t.get("secret") or uuid.uuid4()),
            privsep=bool(t.get("privsep", True)),
            acls=_acls(t.get("acls")),
            expire=int(t.get("expire", 0)),
        )
        cl.tokens[tok.tokenid] = tok
        cl.users.setdefault(tok.userid, User(userid=tok.userid))
    for node in cl.nodes.values():
        node.neighbours = _neighbours(cl, node)
    return cl


def _default_network(node: Node) -> list[dict[str, Any]]:
    return [
        {
            "iface": "eno1",
            "type": "eth",
            "method": "manual",
            "method6": "manual",
            "families": ["inet"],
            "priority": 20,
            "exists": 1,
            "active": 1,
        },
        {
            "iface": "vmbr0",
            "type": "bridge",
            "method": "static",
            "method6": "manual",
            "address": node.ip,
            "netmask": "24",
            "cidr": f"{node.ip}/24",
            "gateway": node.ip.rsplit(".", 1)[0] + ".1",
            "bridge_ports": "eno1",
            "bridge_stp": "off",
            "bridge_fd": "0",
            "bridge_vlan_aware": 1,
            "autostart": 1,
            "active": 1,
            "priority": 10,
            "families": ["inet"],
        },
    ]


def _fw_rule(r: dict[str, Any], pos: int) -> dict[str, Any]:
    rule = {"pos": pos, "type": "in", "action": "ACCEPT", "enable": 1}
    rule.update(r)
    rule["pos"] = pos
    return rule


def _build_guest(g: dict[str, Any], now: float) -> Guest:
    vmid = int(g["vmid"])
    kind = g.get("type", "qemu")
    status = g.get("status", "running")
    cores = int(g.get("cores", 2))
    memory_mb = int(g.get("memory_mb", 2048))
    disk_gb = int(g.get("disk_gb", 32))
    raw_tags = g.get("tags") or []
    # a list: `;`-joined; a string: the config's value as written (`prod Protected`, unnormalised)
    tagstr = raw_tags if isinstance(raw_tags, str) else ";".join(str(t) for t in raw_tags)
    tags = split_tags(tagstr)
    ip = g.get("ip")
    disk_store = g.get("disk_storage", "local-lvm")
    guest = Guest(
        vmid=vmid,
        type=kind,
        node=g["node"],
        name=g["name"],
        status=status,
        tags=tags,
        pool=g.get("pool"),
        cpus=cores,
        maxmem=memory_mb * MiB,
        mem_fraction=float(g.get("mem_fraction", 0.35)),
        maxdisk=disk_gb * GiB,
        disk_used=int(disk_gb * GiB * float(g.get("disk_fraction", 0.3))) if kind == "lxc" else 0,
        cpu_load=float(g.get("cpu", 0.02)),
        template=bool(g.get("template", False)),
        started_at=now - float(g.get("uptime_hours", 72)) * 3600 if status != "stopped" else 0.0,
        pid=10000 + vmid * 7 if status != "stopped" else 0,
        agent=bool(g.get("agent", False)),
        agent_running=bool(g.get("agent_running", True)),
        lock=g.get("lock"),
        netin=vmid * 104729,
        netout=vmid * 7919,
    )
    if g.get("ha"):
        guest.ha = {"state": "started", "max_restart": 1, "max_relocate": 1, **g["ha"]}
    mac = _mac(vmid, 0)
    if kind == "qemu":
        cfg: dict[str, Any] = {
            "name": g["name"],
            "cores": cores,
            "sockets": 1,
            "memory": str(memory_mb),
            "cpu": "x86-64-v2-AES",
            "ostype": g.get("ostype", "l26"),
            "scsihw": "virtio-scsi-single",
            "scsi0": f"{disk_store}:vm-{vmid}-disk-0,iothread=1,size={disk_gb}G",
            "ide2": "none,media=cdrom",
            "net0": f"virtio={mac},bridge=vmbr0,firewall=1",
            "boot": "order=scsi0;ide2;net0",
            "numa": 0,
            "onboot": 1 if g.get("onboot", True) else 0,
            "smbios1": f"uuid={uuid.UUID(_hexid('smbios', vmid)[:32])}",
            "vmgenid": str(uuid.UUID(_hexid("vmgenid", vmid)[:32])),
            "meta": "creation-qemu=9.0.2,ctime=1714500000",
        }
        if guest.agent:
            cfg["agent"] = "1"
        if ip:
            cfg["ipconfig0"] = f"ip={ip}/24,gw={ip.rsplit('.', 1)[0]}.1"
        if guest.template:
            cfg["template"] = 1
        name = "eth0" if g.get("ostype", "l26") == "l26" else "Ethernet"
        guest.interfaces = [
            {"name": "lo", "hwaddr": "00:00:00:00:00:00", "inet": "127.0.0.1/8", "inet6": "::1/128"},
            {
                "name": name,
                "hwaddr": mac.lower(),
                "inet": f"{ip}/24" if ip else None,
                "inet6": f"fe80::be24:11ff:fe{mac[9:11].lower()}:{mac[12:14].lower()}{mac[15:17].lower()}/64",
            },
        ]
    else:
        cfg = {
            "hostname": g["name"],
            "arch": "amd64",
            "ostype": g.get("ostype", "debian"),
            "cores": cores,
            "memory": memory_mb,
            "swap": int(g.get("swap_mb", 512)),
            "rootfs": f"{disk_store}:vm-{vmid}-disk-0,size={disk_gb}G",
            "net0": f"name=eth0,bridge=vmbr0,firewall=1,hwaddr={mac}"
            + (f",ip={ip}/24,gw={ip.rsplit('.', 1)[0]}.1" if ip else ",ip=dhcp")
            + ",type=veth",
            "onboot": 1 if g.get("onboot", True) else 0,
            "unprivileged": 1,
        }
        if g.get("docker") is not None:
            cfg["features"] = "keyctl=1,nesting=1"
        guest.interfaces = [
            {"name": "lo", "hwaddr": "00:00:00:00:00:00", "inet": "127.0.0.1/8", "inet6": "::1/128"},
            {"name": "eth0", "hwaddr": mac.lower(), "inet": f"{ip}/24" if ip else None},
        ]
        if g.get("docker") is not None:
            guest.interfaces.append({"name": "docker0", "hwaddr": "02:42:" + mac.lower()[6:], "inet": "172.17.0.1/16"})
    if tagstr:
        cfg["tags"] = tagstr
    if g.get("description"):
        cfg["description"] = g["description"]
    if g.get("protection"):
        cfg["protection"] = 1
    cfg.update(g.get("config") or {})
    guest.config = cfg
    parent = None
    for s in g.get("snapshots") or []:
        snap = Snapshot(
            name=s["name"],
            snaptime=int(now - float(s.get("age_hours", 24)) * 3600),
            description=s.get("description", ""),
            vmstate=bool(s.get("vmstate", False)),
            parent=parent,
            config=dict(cfg),
        )
        guest.snapshots.append(snap)
        parent = snap.name
    if g.get("docker") is not None:
        guest.docker = [_container(vmid, d, now) for d in g["docker"]]
    return guest


def _container(vmid: int, d: dict[str, Any], now: float) -> DockerContainer:
    labels = dict(d.get("labels") or {})
    comp = d.get("compose")
    if comp:
        wd = comp.get("workdir", f"/opt/{comp['project']}")
        labels.update(
            {
                "com.docker.compose.project": comp["project"],
                "com.docker.compose.service": comp["service"],
                "com.docker.compose.project.working_dir": wd,
                "com.docker.compose.project.config_files": f"{wd}/compose.yaml",
                "com.docker.compose.container-number": "1",
                "com.docker.compose.oneoff": "False",
                "com.docker.compose.version": "2.29.7",
                "com.docker.compose.config-hash": _hexid("cfg", vmid, d["name"]),
            }
        )
    return DockerContainer(
        id=_hexid("ctr", vmid, d["name"]),
        name=d["name"],
        image=d["image"],
        state=d.get("state", "running"),
        created=int(now - float(d.get("age_hours", 100)) * 3600),
        command=d.get("command", '"docker-entrypoint.sh"'),
        health=d.get("health"),
        ports=list(d.get("ports", [])),
        labels=labels,
        env=list(d.get("env", [])),
        restart=d.get("restart", "unless-stopped"),
        exit_code=int(d.get("exit_code", 0)),
        networks=list(d.get("networks", [f"{comp['project']}_default"] if comp else ["bridge"])),
        mounts=list(d.get("mounts", [])),
    )


def _backup_volume(cl: Cluster, b: dict[str, Any], now: float) -> Volume:
    vmid = int(b["vmid"])
    g = cl.guests.get(vmid)
    kind = b.get("type") or (g.type if g else "qemu")
    ctime = int(now - float(b.get("age_hours", 24)) * 3600)
    st = cl.storages[b["storage"]]
    stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.gmtime(ctime))
    if st.type == "pbs":
        iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctime))
        volid = f"{st.id}:backup/{'vm' if kind == 'qemu' else 'ct'}/{vmid}/{iso}"
        fmt = "pbs-vm" if kind == "qemu" else "pbs-ct"
    else:
        ext = "vma.zst" if kind == "qemu" else "tar.zst"
        volid = f"{st.id}:backup/vzdump-{kind}-{vmid}-{stamp}.{ext}"
        fmt = ext
    return Volume(
        storage=st.id,
        volid=volid,
        content="backup",
        format=fmt,
        size=int(float(b.get("size_mb", 1024)) * MiB),
        node=None if st.shared else b.get("node", g.node if g else None),
        vmid=vmid,
        ctime=ctime,
        notes=b.get("notes", g.name if g else None),
        protected=bool(b.get("protected", False)),
        subtype=kind,
        config=dict(g.config) if g else None,
    )


def _disk_volumes(cl: Cluster) -> None:
    """Images/rootdir volumes mirror the guests' disk config lines."""
    for g in cl.guests.values():
        key = "scsi0" if g.type == "qemu" else "rootfs"
        line = str(g.config.get(key, ""))
        if ":" not in line:
            continue
        store, rest = line.split(":", 1)
        if store not in cl.storages:
            continue
        vol = rest.split(",", 1)[0]
        fmt = "raw" if g.type == "qemu" or cl.storages[store].type != "zfspool" else "subvol"
        cl.volumes.append(
            Volume(
                storage=store,
                volid=f"{store}:{vol}",
                content="images" if g.type == "qemu" else "rootdir",
                format=fmt,
                size=g.maxdisk,
                node=None if cl.storages[store].shared else g.node,
                vmid=g.vmid,
                ctime=int(cl.created - 86400 * 30),
                used=g.disk_used or None,
            )
        )


def _neighbours(cl: Cluster, node: Node) -> list[dict[str, Any]]:
    """ARP view of a node: its gateway plus the guests running on it."""
    gw = node.ip.rsplit(".", 1)[0] + ".1"
    out: list[dict[str, Any]] = [{"dst": gw, "dev": "vmbr0", "lladdr": "aa:bb:cc:00:00:01", "state": ["REACHABLE"]}]
    for other in cl.nodes.values():
        if other.name != node.name:
            state = "REACHABLE" if other.online else "FAILED"
            entry: dict[str, Any] = {"dst": other.ip, "dev": "vmbr0", "state": [state]}
            if other.online:
                entry["lladdr"] = f"aa:bb:cc:00:01:{other.nodeid:02x}"
            out.append(entry)
    for g in cl.guests.values():
        if g.node != node.name:
            continue
        for itf in g.interfaces:
            inet = itf.get("inet")
            if itf["name"] in ("eth0", "Ethernet") and inet:
                state = "REACHABLE" if g.status == "running" else "STALE"
                out.append(
                    {"dst": inet.split("/")[0], "dev": f"fwbr{g.vmid}i0", "lladdr": itf["hwaddr"], "state": [state]}
                )
    return out
