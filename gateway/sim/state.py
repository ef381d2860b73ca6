"""In-memory model of one simulated Proxmox VE cluster.

Both the HTTPS API and the SSH servers render from this one object, so the two
views can never disagree. Mutations bump `version`, which invalidates caches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

GuestType = Literal["qemu", "lxc"]


@dataclass
class DockerContainer:
    id: str  # 64 hex chars, like `docker ps --no-trunc`
    name: str
    image: str
    state: str  # running | exited | paused | restarting | created | dead
    created: int  # epoch seconds
    command: str = ""
    health: str | None = None  # healthy | unhealthy | starting
    ports: list[str] = field(default_factory=list)  # "0.0.0.0:80->80/tcp"
    labels: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)  # may hold planted secrets
    restart: str = "unless-stopped"
    exit_code: int = 0
    networks: list[str] = field(default_factory=lambda: ["bridge"])
    mounts: list[str] = field(default_factory=list)


@dataclass
class Snapshot:
    name: str
    snaptime: int
    description: str = ""
    vmstate: bool = False
    parent: str | None = None
    config: dict[str, Any] = field(default_factory=dict)


@dataclass
class Guest:
    vmid: int
    type: GuestType
    node: str
    name: str
    status: str = "stopped"  # running | stopped | paused (qemu suspend)
    tags: list[str] = field(default_factory=list)
    pool: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, Any] = field(default_factory=dict)  # saved, applied at the next start
    snapshots: list[Snapshot] = field(default_factory=list)
    lock: str | None = None
    ha: dict[str, Any] | None = None  # {"state": "started", "group": "..."}
    cpus: int = 1
    maxmem: int = 1 << 30
    mem_fraction: float = 0.4
    maxdisk: int = 8 << 30
    disk_used: int = 0
    cpu_load: float = 0.02
    template: bool = False
    started_at: float = 0.0
    pid: int = 0
    agent: bool = False  # qemu guest agent enabled in config
    agent_running: bool = True  # the agent answers while the VM runs
    interfaces: list[dict[str, Any]] = field(default_factory=list)  # name, hwaddr, inet, inet6
    docker: list[DockerContainer] | None = None  # None: docker not installed
    netin: int = 0
    netout: int = 0

    @property
    def sid(self) -> str:
        return f"{'vm' if self.type == 'qemu' else 'ct'}:{self.vmid}"

    def uptime(self, now: float) -> int:
        return int(now - self.started_at) if self.status != "stopped" else 0

    def mem(self) -> int:
        return int(self.maxmem * self.mem_fraction) if self.status != "stopped" else 0


@dataclass
class Node:
    name: str
    nodeid: int
    ip: str
    online: bool = True
    maxcpu: int = 16
    maxmem: int = 64 << 30
    mem: int = 12 << 30
    maxdisk: int = 100 << 30
    disk: int = 10 << 30
    cpu_load: float = 0.05
    boot_time: float = 0.0
    level: str = ""
    cpu_model: str = "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz"
    kernel: str = "6.8.12-4-pve"
    network: list[dict[str, Any]] = field(default_factory=list)
    neighbours: list[dict[str, Any]] = field(default_factory=list)
    ssl_fingerprint: str = ""
    # the node's own /etc/vzdump.conf (e.g. {"prune-backups": "keep-last=3"} or a legacy
    # {"maxfiles": 2}): a backup without a retention of its own or its storage's prunes by it
    vzdump_conf: dict[str, Any] = field(default_factory=dict)


@dataclass
class Storage:
    id: str
    type: str  # dir | lvmthin | zfspool | nfs | cifs | pbs | rbd ...
    content: list[str]
    shared: bool = False
    nodes: list[str] | None = None  # None: all nodes
    total: int | None = None  # None: free space not measurable
    used: int | None = None
    active: bool = True
    enabled: bool = True
    path: str | None = None
    server: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Volume:
    storage: str
    volid: str
    content: str
    format: str
    size: int
    node: str | None = None  # for non-shared storage: which node's copy
    vmid: int | None = None
    ctime: int | None = None
    notes: str | None = None
    protected: bool = False
    subtype: str | None = None
    used: int | None = None
    config: dict[str, Any] | None = None  # a backup: the guest configuration it holds


@dataclass
class Pool:
    id: str
    comment: str = ""
    storages: list[str] = field(default_factory=list)


@dataclass
class AclEntry:
    path: str
    roles: list[str]
    propagate: bool = True


@dataclass
class User:
    userid: str  # user@realm
    acls: list[AclEntry] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    # identity fields (handlers_access.py); the password is kept only as a hash, like PVE's shadow.cfg
    email: str = ""
    firstname: str = ""
    lastname: str = ""
    comment: str = ""
    enable: bool = True
    expire: int = 0
    password_hash: str | None = None


@dataclass
class Token:
    name: str  # scenario name, e.g. "admin"
    tokenid: str  # user@realm!name
    secret: str  # uuid
    privsep: bool = True
    acls: list[AclEntry] = field(default_factory=list)
    expire: int = 0  # 0: never
    comment: str = ""

    @property
    def userid(self) -> str:
        return self.tokenid.split("!", 1)[0]


@dataclass
class Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    status: str = "running"  # running | stopped
    exitstatus: str | None = None
    endtime: int | None = None
    log: list[str] = field(default_factory=list)


@dataclass
class Cluster:
    name: str
    version: str = "8.4.1"  # pve-manager version; release is major.minor
    repoid: str = "2a5fa54a8503f96d"
    config_version: int = 24
    nodes: dict[str, Node] = field(default_factory=dict)
    guests: dict[int, Guest] = field(default_factory=dict)
    storages: dict[str, Storage] = field(default_factory=dict)
    volumes: list[Volume] = field(default_factory=list)
    pools: dict[str, Pool] = field(default_factory=dict)
    users: dict[str, User] = field(default_factory=dict)
    tokens: dict[str, Token] = field(default_factory=dict)  # by tokenid
    roles: dict[str, list[str]] = field(default_factory=dict)  # custom roles
    groups: dict[str, list[AclEntry]] = field(default_factory=dict)
    group_comments: dict[str, str] = field(default_factory=dict)
    realms: list[dict[str, Any]] = field(default_factory=list)  # /access/domains rows
    tfa: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # userid -> TFA entries (no secrets)
    backup_jobs: list[dict[str, Any]] = field(default_factory=list)
    firewall_rules: list[dict[str, Any]] = field(default_factory=list)
    guest_firewall_rules: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    ha_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    firewall: dict[str, Any] = field(default_factory=dict)  # aliases, IP sets, groups, node rules, options
    sdn: dict[str, Any] = field(default_factory=dict)  # zones, vnets, subnets: running and pending
    ha_rules: dict[str, dict[str, Any]] = field(default_factory=dict)  # PVE 9: HA rules (groups migrated)
    ceph: dict[str, Any] | None = None
    ceph_detail: dict[str, Any] = field(default_factory=dict)  # OSDs, pools, daemons, flags (handlers_ceph.py)
    tasks: dict[str, Task] = field(default_factory=dict)
    replication_jobs: list[dict[str, Any]] = field(default_factory=list)  # storage replication (handlers_cluster)
    metrics_servers: list[dict[str, Any]] | None = None  # None: the default set (handlers_cluster.py)
    node_ops: dict[str, Any] = field(default_factory=dict)  # per node: apt, services, logs (gateway/sim/nodeops.py)
    task_seconds: float = 0.3
    auth_failure_delay: float = 0.0
    version_counter: int = 0  # bumped on every mutation (cache key)
    created: float = field(default_factory=time.time)

    @property
    def release(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def touch(self) -> None:
        self.version_counter += 1

    def pool_of(self, vmid: int) -> str | None:
        g = self.guests.get(vmid)
        return g.pool if g else None

    def storages_on(self, node: str) -> list[Storage]:
        return [s for s in self.storages.values() if s.nodes is None or node in s.nodes]

    def local_node(self) -> str:
        return next(iter(self.nodes))
