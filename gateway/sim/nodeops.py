"""Per-node operating-system state the node-operations endpoints share: the APT cache and
installed packages, service states, the system log, and staged network changes.

Created lazily from the cluster so scenarios need not spell it out; every endpoint reads
and writes the same object, so a restart shows in the log and a refresh in the update list.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.sim.state import Cluster

SERVICES = [
    ("pveproxy", "PVE API Proxy Server"),
    ("pvedaemon", "PVE API Daemon"),
    ("pvestatd", "PVE Status Daemon"),
    ("pve-cluster", "The Proxmox VE cluster filesystem"),
    ("corosync", "Corosync Cluster Engine"),
    ("pve-firewall", "Proxmox VE firewall"),
    ("pve-ha-crm", "PVE Cluster HA Resource Manager Daemon"),
    ("pve-ha-lrm", "PVE Local HA Resource Manager Daemon"),
    ("pvescheduler", "Proxmox VE scheduler"),
    ("sshd", "OpenBSD Secure Shell server"),
    ("chrony", "chrony, an NTP client/server"),
    ("cron", "Regular background program processing daemon"),
    ("postfix", "Postfix Mail Transport Agent (instance -)"),
    ("spiceproxy", "PVE SPICE Proxy Server"),
    ("systemd-journald", "Journal Service"),
    ("syslog", "System Logging Service"),
    ("ksmtuned", "Kernel Samepage Merging (KSM) Tuning Daemon"),
    ("pvefw-logger", "Proxmox VE firewall logger"),
    ("systemd-timesyncd", "Network Time Synchronization"),
]
NOT_INSTALLED = {"systemd-timesyncd"}  # chrony replaces it on PVE 8


@dataclass
class Package:
    name: str
    title: str
    version: str  # installed
    section: str = "admin"
    origin: str = "Proxmox"


@dataclass
class NodeOps:
    installed: dict[str, Package]
    candidates: dict[str, str]  # package -> newer version, as of the last refresh
    upstream: dict[str, str]  # what the repositories offer now (a refresh copies it)
    services: dict[str, dict[str, Any]]
    log: list[tuple[float, str, str]] = field(default_factory=list)  # (time, unit, message)
    network_pending: list[dict[str, Any]] | None = None
    last_refresh: float = 0.0


def _bump(version: str, by: int = 1) -> str:
    head, _, last = version.rpartition(".")
    return f"{head}.{int(last) + by}" if last.isdigit() else version + "+1"


def _packages(cl: Cluster, kernel: str) -> dict[str, Package]:
    pkgs = [
        Package("proxmox-ve", "Proxmox Virtual Environment", f"{cl.release}.0", "admin"),
        Package("pve-manager", "Proxmox Virtual Environment Management Tools", cl.version),
        Package(f"proxmox-kernel-{kernel}-signed", "Proxmox Kernel Image (signed)", "6.8.12-4", "kernel"),
        Package("qemu-server", "Qemu Server Tools", "8.3.12"),
        Package("pve-container", "Proxmox VE Container management tool", "5.2.6"),
        Package("libpve-storage-perl", "Proxmox VE storage management library", "8.3.6", "perl"),
        Package("libpve-common-perl", "Proxmox VE base library", "8.3.1", "perl"),
        Package("pve-ha-manager", "Proxmox VE HA Manager", "4.0.7"),
        Package("corosync", "cluster engine daemon and utilities", "3.1.9-pve1"),
        Package("zfsutils-linux", "command-line tools to manage OpenZFS filesystems", "2.2.7-pve2"),
        Package("openssl", "Secure Sockets Layer toolkit", "3.0.15-1~deb12u1", "utils", "Debian"),
    ]
    return {p.name: p for p in pkgs}


def ops(cl: Cluster, node: str) -> NodeOps:
    """The node's state, created on first use."""
    existing = cl.node_ops.get(node)
    if isinstance(existing, NodeOps):
        return existing
    n = cl.nodes[node]
    installed = _packages(cl, n.kernel)
    # the cache knows two updates; the repositories have a new kernel too (seen after a refresh)
    candidates = {"pve-manager": _bump(cl.version, 4), "libpve-common-perl": "8.3.2"}
    upstream = {**candidates, "proxmox-kernel-6.8.12-9-pve-signed": "6.8.12-9", "openssl": "3.0.16-1~deb12u1"}
    services = {
        name: {
            "service": name,
            "name": name,
            "desc": desc,
            "state": "dead" if name in NOT_INSTALLED else "running",
            "active-state": "inactive" if name in NOT_INSTALLED else "active",
            "unit-state": "not-found" if name in NOT_INSTALLED else "enabled",
        }
        for name, desc in SERVICES
    }
    st = NodeOps(installed=installed, candidates=candidates, upstream=upstream, services=services)
    st.last_refresh = time.time() - 86400
    st.log = _seed_log(node, time.time())
    if node == "pve2":  # a staged, unapplied change: a second bridge for the storage network
        pending = copy.deepcopy(n.network)
        pending.append(
            {"iface": "vmbr1", "type": "bridge", "method": "static", "address": "10.10.5.12", "netmask": "24",
             "cidr": "10.10.5.12/24", "bridge_ports": "eno2", "bridge_stp": "off", "bridge_fd": "0",
             "autostart": 1, "families": ["inet"], "priority": 9, "comments": "storage network\n"}
        )  # fmt: skip
        st.network_pending = pending
    cl.node_ops[node] = st
    return st


_SEED = [
    ("pvedaemon", "pvedaemon[{pid}]: <root@pam> successful auth for user 'root@pam'"),
    ("pveproxy", "pveproxy[{pid}]: worker {pid2} finished"),
    ("pveproxy", "pveproxy[{pid}]: worker {pid2} started"),
    ("pvestatd", "pvestatd[{pid}]: status update time (0.{ms} seconds)"),
    ("cron", "CRON[{pid}]: pam_unix(cron:session): session opened for user root(uid=0) by (uid=0)"),
    ("corosync", "corosync[{pid}]:   [KNET  ] host: host: 2 (passive) best link: 0 (pri: 1)"),
    ("pvescheduler", "pvescheduler[{pid}]: starting replication/backup job scheduler"),
    ("chrony", "chronyd[{pid}]: Selected source 10.10.0.1"),
]


def _seed_log(node: str, now: float) -> list[tuple[float, str, str]]:
    """300 lines over the last 25 hours, deterministic per node."""
    out = []
    base = sum(map(ord, node))
    for i in range(300):
        unit, text = _SEED[(i * 5 + base) % len(_SEED)]
        pid = 1000 + (i * 37 + base) % 9000
        out.append((now - (300 - i) * 300, unit, text.format(pid=pid, pid2=pid + 11, ms=(i * 13) % 90 + 10)))
    return out


def log_line(node: str, t: float, message: str) -> str:
    return time.strftime("%b %d %H:%M:%S", time.gmtime(t)) + f" {node} {message}"


def append_log(cl: Cluster, node: str, unit: str, message: str) -> None:
    ops(cl, node).log.append((time.time(), unit, message))


def network_changes(cl: Cluster, node: str) -> str | None:
    """The unified diff PVE sends as `changes` when /etc/network/interfaces.new exists."""
    st = ops(cl, node)
    if st.network_pending is None:
        return None
    old = {i["iface"] for i in cl.nodes[node].network}
    added = [i for i in st.network_pending if i["iface"] not in old]
    removed = [i for i in cl.nodes[node].network if i["iface"] not in {x["iface"] for x in st.network_pending}]
    lines = ["--- /etc/network/interfaces", "+++ /etc/network/interfaces.new", "@@ -1 +1 @@"]
    for i in added:
        lines += [f"+auto {i['iface']}", f"+iface {i['iface']} inet {i.get('method', 'manual')}"]
        if i.get("cidr"):
            lines.append(f"+\taddress {i['cidr']}")
        if i.get("bridge_ports"):
            lines.append(f"+\tbridge-ports {i['bridge_ports']}")
    for i in removed:
        lines += [f"-auto {i['iface']}", f"-iface {i['iface']} inet {i.get('method', 'manual')}"]
    return "\n".join(lines) + "\n"
