"""The commands a simulated node answers over SSH, rendered from shared state.

Only read-only commands exist; anything else fails like a shell would
(exit 127 "command not found") or like the tool would (usage error). A coreutils
`timeout` prefix is read by `split_timeout`; the SSH server enforces it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.sim import docker
from gateway.sim.auth import Principal
from gateway.sim.errors import ApiError
from gateway.sim.runtime import Runtime
from gateway.sim.schema import ParamError
from gateway.sim.state import Token


@dataclass
class Result:
    stdout: str = ""
    stderr: str = ""
    exit_status: int = 0


@dataclass(frozen=True)
class Timeout:
    """A coreutils `timeout` prefix: the command is sent `signal` once `duration` seconds have passed."""

    duration: float  # 0: no limit
    kill_after: float | None
    signal: str
    preserve_status: bool


SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "ALRM": 14, "TERM": 15}
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _interval(text: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def _signal(text: str) -> str | None:
    name = text.upper().removeprefix("SIG")
    if name.isdigit():
        return next((n for n, v in SIGNALS.items() if v == int(name)), None)
    return name if name in SIGNALS else None


def split_timeout(argv: list[str]) -> tuple[Timeout | None, list[str]] | Result:
    """`timeout [-k D] [-s SIG] [--preserve-status] [--foreground] [-v] DURATION COMMAND...` as GNU
    coreutils reads it (options stop at the first operand): the limit and the command, or its usage error."""
    if not argv or argv[0].rsplit("/", 1)[-1] != "timeout":
        return None, argv
    kill_after: float | None = None
    sig = "TERM"
    preserve = False
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        opt, value = argv[i], None
        i += 1
        if opt == "--":
            break
        for short, long in (("-k", "--kill-after"), ("-s", "--signal")):
            if opt in (short, long):
                if i >= len(argv):
                    return Result(stderr=f"timeout: option requires an argument -- '{short[1]}'\n", exit_status=125)
                opt, value = short, argv[i]
                i += 1
            elif opt.startswith(long + "="):
                opt, value = short, opt[len(long) + 1 :]
            elif opt.startswith(short) and len(opt) > 2:
                opt, value = short, opt[2:]
        if opt == "-k" and value is not None:
            kill_after = _interval(value)
            if kill_after is None:
                return Result(stderr=f"timeout: invalid time interval '{value}'\n", exit_status=125)
        elif opt == "-s" and value is not None:
            named = _signal(value)
            if named is None:
                return Result(stderr=f"timeout: '{value}': invalid signal\n", exit_status=125)
            sig = named
        elif opt == "--preserve-status":
            preserve = True
        elif opt not in ("--foreground", "-v", "--verbose"):
            return Result(stderr=f"timeout: unrecognized option '{opt}'\n", exit_status=125)
    if i >= len(argv):
        return Result(stderr="timeout: missing operand\n", exit_status=125)
    duration = _interval(argv[i])
    if duration is None:
        return Result(stderr=f"timeout: invalid time interval '{argv[i]}'\n", exit_status=125)
    if i + 1 >= len(argv):
        return Result(stderr=f"timeout: missing operand after '{argv[i]}'\n", exit_status=125)
    return Timeout(duration, kill_after, sig, preserve), argv[i + 1 :]


ROOT = Principal(tokenid="root@pam", token=Token(name="root", tokenid="root@pam!shell", secret="", privsep=False))


def run(rt: Runtime, node: str, argv: list[str]) -> Result:
    if not argv:
        return Result(exit_status=0)
    cmd = argv[0].rsplit("/", 1)[-1] if argv[0].startswith("/usr/") or argv[0].startswith("/bin/") else argv[0]
    fn = COMMANDS.get(cmd)
    if fn is None:
        return Result(
            stderr=f"bash: line 1: {argv[0]}: command not found (pvegate simulator: read-only commands only)\n",
            exit_status=127,
        )
    return fn(rt, node, argv[1:])


def _pvesh(rt: Runtime, node: str, args: list[str]) -> Result:
    from gateway.sim.api import check_schema_perm  # noqa: F401  (import cycle: api imports handlers)
    from gateway.sim.routes import ROUTES, Ctx, RawBody, Reply

    if len(args) < 2 or args[0] not in ("get", "ls", "usage", "create", "set", "delete"):
        return Result(
            stderr="ERROR: unknown command 'pvesh "
            + " ".join(args[:1])
            + "'\nUSAGE: pvesh <COMMAND> [ARGS] [OPTIONS]\n",
            exit_status=255,
        )
    if args[0] != "get":
        return Result(stderr="simulator: only 'pvesh get' is available (read-only node)\n", exit_status=255)
    path = "/" + args[1].strip("/")
    fmt = "text"
    params: dict[str, str] = {}
    rest = args[2:]
    i = 0
    while i < len(rest):
        a = rest[i]
        if not a.startswith("--"):
            return Result(
                stderr="400 too many arguments\npvesh get <api_path> [OPTIONS] [FORMAT_OPTIONS]\n", exit_status=255
            )
        name = a[2:]
        val = "1"
        if "=" in name:
            name, val = name.split("=", 1)
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            val = rest[i + 1]
            i += 1
        if name == "output-format":
            fmt = val
        elif name in ("noborder", "noheader", "human-readable", "quiet", "noproxy"):
            pass
        else:
            params[name] = val
        i += 1
    path = path.replace("/nodes/localhost", f"/nodes/{node}", 1)
    ep, path_params, _known = rt.schema.match("GET", path)
    handler = ROUTES.get(("GET", ep.path)) if ep else None
    if handler is None:
        return Result(stderr=f"No '{'get'}' handler defined for '{path}'\n", exit_status=255)
    try:
        vparams = rt.schema.validate(ep, {**params, **path_params})
    except ParamError as e:
        msg = "".join(f"{k}: {v}\n" for k, v in e.errors.items())
        return Result(stderr=f"400 Parameter verification failed.\n{msg}", exit_status=255)
    ctx = Ctx(rt=rt, principal=ROOT, method="GET", path=path, params=vparams)
    try:
        data = handler(ctx)
    except ApiError as e:
        return Result(stderr=f"{e.message}\n", exit_status=255)
    if isinstance(data, RawBody):
        data = json.loads(data.body)["data"]
    elif isinstance(data, Reply):
        data = data.data
    if fmt == "json":
        return Result(stdout=json.dumps(data, separators=(",", ":")) + "\n")
    if fmt == "json-pretty":
        return Result(stdout=json.dumps(data, indent=4, sort_keys=True) + "\n")
    return Result(stdout=_text(data))


def _text(data: Any) -> str:
    if isinstance(data, list) and data and isinstance(data[0], dict):
        keys = sorted({k for d in data for k in d})
        lines = ["  ".join(keys)] + ["  ".join(str(d.get(k, "")) for k in keys) for d in data]
        return "\n".join(lines) + "\n"
    if isinstance(data, dict):
        return "".join(f"{k}: {json.dumps(v) if isinstance(v, dict | list) else v}\n" for k, v in sorted(data.items()))
    return f"{data}\n"


def _qm(rt: Runtime, node: str, args: list[str]) -> Result:
    if args[:1] != ["list"]:
        return Result(stderr="simulator: only 'qm list' is available (read-only node)\n", exit_status=255)
    guests = sorted(
        (g for g in rt.cluster.guests.values() if g.node == node and g.type == "qemu"), key=lambda g: g.vmid
    )
    if not guests:
        return Result()
    lines = ["%10s %-20s %-10s %-10s %12s %-10s" % ("VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID")]  # noqa: UP031  (mirrors qm.pm printf)
    for g in guests:
        lines.append(
            "%10s %-20s %-10s %-10s %12.2f %-10s"  # noqa: UP031
            % (
                g.vmid,
                g.name,
                g.status,
                g.maxmem // (1 << 20),
                g.maxdisk / (1 << 30),
                g.pid if g.status != "stopped" else 0,
            )
        )
    return Result(stdout="\n".join(lines) + "\n")


def _pct(rt: Runtime, node: str, args: list[str]) -> Result:
    if args[:1] == ["list"]:
        guests = sorted(
            (g for g in rt.cluster.guests.values() if g.node == node and g.type == "lxc"), key=lambda g: g.vmid
        )
        if not guests:
            return Result()
        lines = ["%-10s %-10s %-12s %-20s" % ("VMID", "Status", "Lock", "Name")]  # noqa: UP031  (mirrors pct.pm printf)
        lines += ["%-10s %-10s %-12s %-20s" % (g.vmid, g.status, g.lock or "", g.name) for g in guests]  # noqa: UP031
        return Result(stdout="\n".join(line.rstrip() for line in lines) + "\n")
    if args[:1] == ["exec"]:
        return _pct_exec(rt, node, args[1:])
    return Result(stderr="simulator: only 'pct list' and 'pct exec' are available (read-only node)\n", exit_status=255)


def _pct_exec(rt: Runtime, node: str, args: list[str]) -> Result:
    if not args or not args[0].isdigit():
        return Result(stderr="400 not enough arguments\npct exec <vmid> [<extra-args>]\n", exit_status=255)
    vmid = int(args[0])
    inner = args[1:]
    if inner[:1] == ["--"]:
        inner = inner[1:]
    g = rt.cluster.guests.get(vmid)
    if g is None or g.node != node or g.type != "lxc":
        # pct only knows containers; a QEMU vmid has no CT config on this node
        return Result(stderr=f"Configuration file 'nodes/{node}/lxc/{vmid}.conf' does not exist\n", exit_status=255)
    if g.status != "running":
        return Result(stderr=f"container '{vmid}' not running!\n", exit_status=255)
    if not inner:
        return Result(stderr="missing command\n", exit_status=255)
    if inner[0] != "docker":
        prog = inner[0]
        if prog in ("true",):
            return Result()
        # lxc_attach_run_command exits 127 when execvp finds no such program (126: not executable)
        return Result(
            stderr=f"lxc-attach: {vmid}: ../src/lxc/attach.c: lxc_attach_run_command: 1840 No such file "
            f'or directory - Failed to exec "{prog}"\n',
            exit_status=127,
        )
    if g.docker is None:
        return Result(
            stderr=f"lxc-attach: {vmid}: ../src/lxc/attach.c: lxc_attach_run_command: 1840 No such file "
            'or directory - Failed to exec "docker"\n',
            exit_status=127,
        )
    out, err, code = docker.run(g, inner[1:])
    return Result(stdout=out, stderr=err, exit_status=code)


def _ip(rt: Runtime, node: str, args: list[str]) -> Result:
    n = rt.cluster.nodes[node]
    as_json = "-j" in args or "-json" in args
    rest = [a for a in args if not a.startswith("-")]
    if rest[:1] not in (["neigh"], ["neighbor"], ["neighbour"], ["n"]) or rest[1:] not in ([], ["show"], ["list"]):
        return Result(stderr="simulator: only 'ip [-j] neigh [show]' is available\n", exit_status=255)
    if as_json:
        return Result(stdout=json.dumps(n.neighbours, separators=(",", ":")) + "\n")
    lines = []
    for e in n.neighbours:
        ll = f" lladdr {e['lladdr']}" if "lladdr" in e else ""
        lines.append(f"{e['dst']} dev {e['dev']}{ll} {' '.join(e['state'])}")
    return Result(stdout="\n".join(lines) + "\n")


def _ping(rt: Runtime, node: str, args: list[str]) -> Result:
    target = next((a for a in reversed(args) if not a.startswith("-")), None)
    if target is None or target in ("1",):
        return Result(stderr="ping: usage error: Destination address required\n", exit_status=2)
    reachable = {e["dst"] for e in rt.cluster.nodes[node].neighbours if "REACHABLE" in e["state"]}
    reachable.add(rt.cluster.nodes[node].ip)
    reachable.add("127.0.0.1")
    head = f"PING {target} ({target}) 56(84) bytes of data.\n"
    if target in reachable:
        return Result(
            stdout=head + f"64 bytes from {target}: icmp_seq=1 ttl=64 time=0.412 ms\n\n"
            f"--- {target} ping statistics ---\n1 packets transmitted, 1 received, 0% packet loss, time 0ms\n"
            "rtt min/avg/max/mdev = 0.412/0.412/0.412/0.000 ms\n"
        )
    if not all(p.isdigit() for p in target.split(".")) or target.count(".") != 3:
        return Result(stderr=f"ping: {target}: Name or service not known\n", exit_status=2)
    return Result(
        stdout=head + f"\n--- {target} ping statistics ---\n"
        "1 packets transmitted, 0 received, 100% packet loss, time 0ms\n\n",
        exit_status=1,
    )


DF_FORM = ["--output=source,fstype,size,used,avail,target", "-B1", "-x", "tmpfs", "-x", "devtmpfs", "-x", "overlay"]
EFI_SIZE = 1071628288  # a 1 GiB ESP, as the PVE installer makes it


def _df(rt: Runtime, node: str, args: list[str]) -> Result:
    """GNU df's --output table: root, the ESP and every mounted network storage of this node."""
    if args != DF_FORM:
        return Result(stderr="simulator: only 'df " + " ".join(DF_FORM) + "' is available\n", exit_status=255)
    n = rt.cluster.nodes[node]
    rows = [
        ("/dev/mapper/pve-root", "ext4", n.maxdisk, n.disk, n.maxdisk - n.disk, "/"),
        ("/dev/sda2", "vfat", EFI_SIZE, 8962048, EFI_SIZE - 8962048, "/boot/efi"),
    ]
    for st in rt.cluster.storages_on(node):  # PVE mounts nfs/cifs storage at /mnt/pve/<id> while active
        if st.type in ("nfs", "cifs") and st.enabled and st.active and st.total is not None:
            used = st.used or 0
            fstype = "nfs4" if st.type == "nfs" else "cifs"
            source = f"{st.server or 'nas'}:/{st.id}"
            rows.append((source, fstype, st.total, used, st.total - used, f"/mnt/pve/{st.id}"))
    lines = [f"{'Filesystem':<24} {'Type':<6} {'1B-blocks':>15} {'Used':>15} {'Avail':>15} Mounted on"]
    lines += [f"{a:<24} {b:<6} {c:>15} {d:>15} {e:>15} {f}" for a, b, c, d, e, f in rows]
    return Result(stdout="\n".join(lines) + "\n")


COMMANDS = {"pvesh": _pvesh, "qm": _qm, "pct": _pct, "ip": _ip, "ping": _ping, "df": _df}
