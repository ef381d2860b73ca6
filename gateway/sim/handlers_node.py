"""Node operations as PVE does them: APT cache and refresh, package versions and changelogs,
repositories, service state and restart, node reboot/shutdown, syslog and journal, RRD
history for nodes and guests, one network interface, staged network changes, time, hosts.

State lives in gateway/sim/nodeops.py; every endpoint reads and writes the same object.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from datetime import UTC, datetime
from typing import Any

from gateway.sim.errors import ApiError
from gateway.sim.handlers_write import _set_running, _set_stopped
from gateway.sim.nodeops import append_log, log_line, ops
from gateway.sim.routes import Ctx, Reply, both, kind_of, route

# ---- APT -------------------------------------------------------------------------


@route("GET", "/nodes/{node}/apt/update")
def get_apt_update(ctx: Ctx) -> Any:
    st = ops(ctx.rt.cluster, str(ctx.params["node"]))
    out = []
    for name, version in sorted(st.candidates.items()):
        pkg = st.installed.get(name)
        row: dict[str, Any] = {
            "Package": name,
            "Title": pkg.title if pkg else "Proxmox Kernel Image (signed)",
            "Description": pkg.title if pkg else "Proxmox Kernel Image (signed)",
            "Version": version,
            "Origin": pkg.origin if pkg else "Proxmox",
            "Priority": "optional",
            "Section": pkg.section if pkg else "kernel",
            "Arch": "amd64",
        }
        if pkg:
            row["OldVersion"] = pkg.version
        out.append(row)
    return out


@route("POST", "/nodes/{node}/apt/update")
def post_apt_update(ctx: Ctx) -> Any:
    node = str(ctx.params["node"])
    st = ops(ctx.rt.cluster, node)

    def work() -> list[str]:
        st.candidates = dict(st.upstream)
        st.last_refresh = time.time()
        append_log(ctx.rt.cluster, node, "pvedaemon", f"pvedaemon[2201]: <{ctx.user}> update package database")
        return [
            "starting apt-get update",
            "Hit:1 http://deb.debian.org/debian bookworm InRelease",
            "Get:2 http://download.proxmox.com/debian/pve bookworm InRelease [2,768 B]",
            "Reading package lists...",
        ]

    return ctx.rt.tasks.start(node, "aptupdate", "", ctx.user, work).upid


@route("GET", "/nodes/{node}/apt/versions")
def get_apt_versions(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    st = ops(cl, node)
    out = []
    for p in st.installed.values():
        row: dict[str, Any] = {
            "Package": p.name,
            "Title": p.title,
            "Description": p.title,
            "Version": p.version,
            "OldVersion": p.version,
            "CurrentState": "Installed",
            "Origin": p.origin,
            "Priority": "optional",
            "Section": p.section,
            "Arch": "amd64",
        }
        if p.name == "proxmox-ve":
            row["RunningKernel"] = cl.nodes[node].kernel
        if p.name == "pve-manager":
            row["ManagerVersion"] = cl.version
        out.append(row)
    return out


@route("GET", "/nodes/{node}/apt/changelog")
def get_apt_changelog(ctx: Ctx) -> Any:
    st = ops(ctx.rt.cluster, str(ctx.params["node"]))
    name = str(ctx.params["name"])
    version = (
        ctx.params.get("version")
        or st.candidates.get(name)
        or (st.installed[name].version if name in st.installed else None)
    )
    if version is None or (name not in st.installed and name not in st.candidates):
        raise ApiError(500, f"changelog for '{name}' not available")
    stamp = time.strftime("%a, %d %b %Y %H:%M:%S +0100", time.gmtime(st.last_refresh))
    return (
        f"{name} ({version}) bookworm; urgency=medium\n\n"
        f"  * update to {version}\n\n"
        f"  * fix various issues found since the previous release\n\n"
        f" -- Proxmox Support Team <support@proxmox.com>  {stamp}\n"
    )


VENDOR_REPO_PASSWORD = "Vendor-S3cret-42"  # noqa: S105 - planted: the gateway must never show it


@route("GET", "/nodes/{node}/apt/repositories")
def get_apt_repositories(ctx: Ctx) -> Any:
    suite = "trixie" if ctx.rt.cluster.major >= 9 else "bookworm"

    def repo(uri: str, suites: str, comps: list[str], enabled: bool, comment: str = "") -> dict[str, Any]:
        return {"Types": ["deb"], "URIs": [uri], "Suites": [suites], "Components": comps, "Options": [],
                "Comment": comment, "FileType": "list", "Enabled": enabled}  # fmt: skip

    files = [
        {
            "path": "/etc/apt/sources.list",
            "file-type": "list",
            "repositories": [
                repo("http://deb.debian.org/debian", suite, ["main", "contrib"], True),
                repo("http://deb.debian.org/debian", f"{suite}-updates", ["main", "contrib"], True),
                repo("http://download.proxmox.com/debian/pve", suite, ["pve-no-subscription"], True),
                # a vendor's repository with its credentials in the URI, as apt allows (instead of
                # auth.conf): what node_apt_repositories must never hand on (VENDOR_REPO_PASSWORD)
                repo(
                    f"https://pve-mirror:{VENDOR_REPO_PASSWORD}@repo.vendor.example/debian",
                    suite,
                    ["main"],
                    False,
                    comment=f" vendor agent (from https://pve-mirror:{VENDOR_REPO_PASSWORD}@repo.vendor.example)",
                ),
            ],
            "digest": list(hashlib.sha256(b"sources.list").digest()),
        },
        {
            "path": "/etc/apt/sources.list.d/pve-enterprise.list",
            "file-type": "list",
            "repositories": [repo("https://enterprise.proxmox.com/debian/pve", suite, ["pve-enterprise"], False)],
            "digest": list(hashlib.sha256(b"pve-enterprise.list").digest()),
        },
    ]
    return {
        "files": files,
        "errors": [],
        "digest": hashlib.sha256(b"".join(bytes(f["digest"]) for f in files)).hexdigest(),  # type: ignore[arg-type]
        "infos": [
            {
                "path": "/etc/apt/sources.list",
                "index": "2",
                "kind": "warning",
                "message": "The no-subscription repository is not recommended for production use!",
            }
        ],
        "standard-repos": [
            {"handle": "enterprise", "name": "Enterprise", "status": 0},
            {"handle": "no-subscription", "name": "No-Subscription", "status": 1},
            {"handle": "test", "name": "Test"},
        ],
    }


# ---- services ----------------------------------------------------------------------


@route("GET", "/nodes/{node}/services/{service}/state")
def get_service_state(ctx: Ctx) -> Any:
    st = ops(ctx.rt.cluster, str(ctx.params["node"]))
    return dict(st.services[str(ctx.params["service"])])


@route("POST", "/nodes/{node}/services/{service}/restart")
def post_service_restart(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    name = str(ctx.params["service"])
    svc = ops(cl, node).services[name]

    def work() -> list[str]:
        if svc["unit-state"] == "not-found":
            raise ApiError(500, f"command '/bin/systemctl restart {name}' failed: exit code 5")
        svc.update({"state": "running", "active-state": "active"})
        append_log(cl, node, name, f"systemd[1]: Stopped {name}.service - {svc['desc']}.")
        append_log(cl, node, name, f"systemd[1]: Started {name}.service - {svc['desc']}.")
        return []

    return ctx.rt.tasks.start(node, "srvrestart", name, ctx.user, work).upid


# ---- node power ----------------------------------------------------------------------


@route("POST", "/nodes/{node}/status")
def post_node_status(ctx: Ctx) -> Any:
    """PVE answers at once (null, no task) and the node goes down; a reboot comes back."""
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    command = str(ctx.params["command"])
    n = cl.nodes[node]
    append_log(
        cl,
        node,
        "systemd-logind",
        f"systemd-logind[812]: The system will {'reboot' if command == 'reboot' else 'power off'} now!",
    )
    running = [g for g in cl.guests.values() if g.node == node and g.status != "stopped"]
    for g in running:  # pve-guests stops every guest first
        _set_stopped(g)
    n.online = False
    cl.touch()
    if command == "reboot":

        def back() -> None:
            n.online = True
            n.boot_time = time.time()
            for g in cl.guests.values():
                if g.node == node and str(g.config.get("onboot", "0")) == "1" and not g.template:
                    _set_running(g)
            append_log(cl, node, "kernel", f"kernel: Linux version {n.kernel} (build@proxmox)")
            cl.touch()

        asyncio.get_running_loop().call_later(max(1.0, 3 * ctx.rt.task_seconds()), back)
    return None


# ---- logs ----------------------------------------------------------------------------


def _parse_time(value: Any) -> float | None:
    if value in (None, ""):
        return None
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(str(value), fmt).replace(tzinfo=UTC).timestamp()  # node local time: UTC
        except ValueError:
            continue
    raise ApiError(400, "Parameter verification failed.", {"since": "invalid time"})


def _node_log(ctx: Ctx, node: str) -> list[tuple[float, str, str]]:
    """The node's log with its tasks' starts and ends, as PVE's cluster log_msg also writes them to
    syslog (`pvedaemon[pid]: <user> end task UPID:... <exit status>`), oldest first."""
    tasks: list[tuple[float, str, str]] = []
    for t in ctx.rt.cluster.tasks.values():
        if t.node != node:
            continue
        tasks.append((t.starttime, "pvedaemon", f"pvedaemon[{t.pid}]: <{t.user}> starting task {t.upid}"))
        if t.endtime is not None:
            tasks.append((t.endtime, "pvedaemon", f"pvedaemon[{t.pid}]: <{t.user}> end task {t.upid} {t.exitstatus}"))
    return sorted([*ops(ctx.rt.cluster, node).log, *tasks], key=lambda e: e[0])


@route("GET", "/nodes/{node}/syslog")
def get_syslog(ctx: Ctx) -> Any:
    p = ctx.params
    node = str(p["node"])
    since, until = _parse_time(p.get("since")), _parse_time(p.get("until"))
    service = p.get("service")
    lines = [
        log_line(node, t, msg)
        for t, unit, msg in _node_log(ctx, node)
        if (since is None or t >= since) and (until is None or t <= until) and (not service or unit == service)
    ]
    if not lines:
        lines = ["-- No entries --"]
    start, limit = int(p.get("start", 0)), int(p.get("limit", 50))
    rows = [{"n": i + 1, "t": line} for i, line in enumerate(lines)][start : start + limit]
    return Reply(rows, {"total": len(lines)})


@route("GET", "/nodes/{node}/journal")
def get_journal(ctx: Ctx) -> Any:
    p = ctx.params
    node = str(p["node"])
    entries = [
        (t, log_line(node, t, msg))
        for t, _unit, msg in _node_log(ctx, node)
        if (p.get("since") is None or t >= int(p["since"])) and (p.get("until") is None or t <= int(p["until"]))
    ]
    if p.get("lastentries") is not None:
        entries = entries[-int(p["lastentries"]) :]
    if not entries:
        return []

    def cursor(t: float) -> str:
        return f"s=5c1f0e3a;i={int(t * 1000):x};b=9a8b;m={int(t * 1e6):x};t={int(t * 1e6):x};x=1"

    return [cursor(entries[0][0]), *(line for _, line in entries), cursor(entries[-1][0])]


# ---- RRD -----------------------------------------------------------------------------

STEPS = {"hour": 60, "day": 1800, "week": 10800, "month": 43200, "year": 604800, "decade": 6048000}
ROWS = 70


def _times(timeframe: str) -> list[int]:
    step = STEPS[timeframe]
    last = int(time.time()) // step * step
    return [last - (ROWS - 1 - i) * step for i in range(ROWS)]


def _wave(t: int, seed: int, amplitude: float = 0.3) -> float:
    return 1.0 + amplitude * math.sin(t / 5400.0 + seed)


@route("GET", "/nodes/{node}/rrddata")
def get_node_rrd(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    n = cl.nodes[str(ctx.params["node"])]
    peak = 1.2 if ctx.params.get("cf") == "MAX" else 1.0
    out = []
    for t in _times(str(ctx.params["timeframe"])):
        w = _wave(t, n.nodeid) * peak
        out.append({
            "time": t, "cpu": round(min(1.0, n.cpu_load * w), 5), "maxcpu": n.maxcpu,
            "iowait": round(0.002 * w, 5), "loadavg": round(n.maxcpu * n.cpu_load * w, 2),
            "memtotal": n.maxmem, "memused": int(min(n.maxmem, n.mem * w)), "swaptotal": 8589930496, "swapused": 0,
            "roottotal": n.maxdisk, "rootused": n.disk, "netin": round(125000 * w, 2), "netout": round(98000 * w, 2),
        })  # fmt: skip
    return out


@both("GET", "/nodes/{node}/{kind}/{vmid}/rrddata")
def get_guest_rrd(ctx: Ctx) -> Any:
    g = ctx.guest(kind_of(ctx.path))
    running = g.status != "stopped"
    peak = 1.2 if ctx.params.get("cf") == "MAX" else 1.0
    out = []
    for t in _times(str(ctx.params["timeframe"])):
        w = _wave(t, g.vmid) * peak if running else 0.0
        out.append({
            "time": t, "cpu": round(min(1.0, g.cpu_load * w), 5), "maxcpu": g.cpus,
            "mem": int(g.maxmem * g.mem_fraction * w), "maxmem": g.maxmem,
            "disk": g.disk_used if g.type == "lxc" and running else 0, "maxdisk": g.maxdisk,
            "diskread": round(g.vmid * 64.0 * w, 2), "diskwrite": round(g.vmid * 16.0 * w, 2),
            "netin": round(g.vmid * 12.5 * w, 2), "netout": round(g.vmid * 9.5 * w, 2),
        })  # fmt: skip
    return out


# ---- network, time, hosts ---------------------------------------------------------


@route("GET", "/nodes/{node}/network/{iface}")
def get_network_iface(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    node = str(ctx.params["node"])
    st = ops(cl, node)
    ifaces = st.network_pending if st.network_pending is not None else cl.nodes[node].network
    name = str(ctx.params["iface"])
    row = next((i for i in ifaces if i.get("iface") == name), None)
    if row is None:
        raise ApiError(500, f"interface '{name}' does not exist")
    # PVE answers the parsed stanza: only the list's hash_to_array adds the `iface` key
    return {k: v for k, v in row.items() if k != "iface"}


@route("DELETE", "/nodes/{node}/network")
def delete_network_changes(ctx: Ctx) -> Any:
    node = str(ctx.params["node"])
    ops(ctx.rt.cluster, node).network_pending = None  # unlink /etc/network/interfaces.new
    ctx.rt.cluster.touch()
    return None


@route("GET", "/nodes/{node}/time")
def get_node_time(ctx: Ctx) -> Any:
    now = int(time.time())
    return {"time": now, "localtime": now, "timezone": "Etc/UTC"}


@route("GET", "/nodes/{node}/hosts")
def get_node_hosts(ctx: Ctx) -> Any:
    cl = ctx.rt.cluster
    lines = ["127.0.0.1 localhost.localdomain localhost"]
    lines += [f"{n.ip} {n.name}.lab.internal {n.name}" for n in cl.nodes.values()]
    lines += ["", "# The following lines are desirable for IPv6 capable hosts", "::1     ip6-localhost ip6-loopback"]
    data = "\n".join(lines) + "\n"
    return {"data": data, "digest": hashlib.sha1(data.encode(), usedforsecurity=False).hexdigest()}
