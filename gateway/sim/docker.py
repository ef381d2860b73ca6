"""`docker ps|inspect|compose ls` inside a simulated LXC guest.

Honest on purpose: an `inspect` without a template, or with a template that
asks for `.Config.Env`, returns the environment (with its planted secrets)
exactly as real Docker would. Keeping secrets out is the client's job, by
pinning a template (docs/simulator.md).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from gateway.sim.state import DockerContainer, Guest

ZERO_TIME = "0001-01-01T00:00:00Z"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + ".123456789Z"


def _ago(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s} seconds"
    if s < 3600:
        return f"{s // 60} minutes"
    if s < 172800:
        return f"{s // 3600} hours"
    return f"{s // 86400} days"


def status_text(c: DockerContainer, now: float) -> str:
    if c.state == "running":
        h = f" ({c.health})" if c.health else ""
        return f"Up {_ago(now - c.created)}{h}"
    if c.state == "paused":
        return f"Up {_ago(now - c.created)} (Paused)"
    if c.state == "created":
        return "Created"
    return f"Exited ({c.exit_code}) {_ago(3600 * 3)} ago"


def ps_row(c: DockerContainer, now: float, trunc: bool) -> dict[str, str]:
    cmd = c.command
    if trunc and len(cmd) > 22:
        cmd = cmd[:19] + '…"'
    return {
        "Command": cmd,
        "CreatedAt": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(c.created)),
        "ID": c.id[:12] if trunc else c.id,
        "Image": c.image,
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(c.labels.items())),
        "LocalVolumes": str(sum(1 for m in c.mounts if not m.startswith("/"))),
        "Mounts": ",".join(m.split(":")[0] for m in c.mounts),
        "Names": c.name,
        "Networks": ",".join(c.networks),
        "Ports": ", ".join(c.ports if c.state == "running" else []),
        "RunningFor": f"{_ago(now - c.created)} ago",
        "Size": "0B",
        "State": c.state,
        "Status": status_text(c, now),
    }


def inspect_obj(c: DockerContainer, now: float) -> dict[str, Any]:
    running = c.state == "running"
    state: dict[str, Any] = {
        "Status": c.state,
        "Running": running,
        "Paused": c.state == "paused",
        "Restarting": c.state == "restarting",
        "OOMKilled": False,
        "Dead": c.state == "dead",
        "Pid": (abs(hash(c.id)) % 60000 + 1000) if running else 0,
        "ExitCode": 0 if running else c.exit_code,
        "Error": "",
        "StartedAt": _iso(c.created + 60),
        "FinishedAt": ZERO_TIME if running else _iso(now - 3 * 3600),
    }
    if c.health:
        state["Health"] = {
            "Status": c.health,
            "FailingStreak": 0 if c.health == "healthy" else 3,
            "Log": [
                {
                    "Start": _iso(now - 30),
                    "End": _iso(now - 29),
                    "ExitCode": 0 if c.health == "healthy" else 1,
                    "Output": "",
                }
            ],
        }
    ports: dict[str, Any] = {}
    for p in c.ports:
        if "->" in p:
            host, cport = p.split("->")
            hip, hport = host.rsplit(":", 1)
            ports.setdefault(cport, []).append({"HostIp": hip, "HostPort": hport})
        else:
            ports[p] = None
    nets = {
        n: {
            "IPAddress": f"172.18.0.{2 + i}",
            "Gateway": "172.18.0.1",
            "IPPrefixLen": 16,
            "MacAddress": f"02:42:ac:12:00:{2 + i:02x}",
            "Aliases": [c.labels.get("com.docker.compose.service", c.name)],
        }
        for i, n in enumerate(c.networks)
    }
    return {
        "Id": c.id,
        "Created": _iso(c.created),
        "Path": c.command.strip('"').split(" ")[0],
        "Args": c.command.strip('"').split(" ")[1:],
        "State": state,
        "Image": "sha256:" + c.id[::-1],
        "Name": "/" + c.name,
        "RestartCount": 0,
        "HostConfig": {"RestartPolicy": {"Name": c.restart, "MaximumRetryCount": 0}, "NetworkMode": c.networks[0]},
        "Mounts": [{"Type": "bind", "Source": m.split(":")[0], "Destination": m.split(":")[-1]} for m in c.mounts],
        "Config": {
            "Hostname": c.id[:12],
            "Env": list(c.env),
            "Cmd": c.command.strip('"').split(" "),
            "Image": c.image,
            "Labels": dict(c.labels),
            "ExposedPorts": {k: {} for k in ports},
        },
        "NetworkSettings": {"Ports": ports if running else {}, "Networks": nets},
    }


class TemplateError(Exception):
    pass


_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")


def _lookup(obj: Any, expr: str) -> Any:
    if expr == ".":
        return obj
    cur = obj
    for part in expr.lstrip(".").split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise TemplateError(
                f'template: :1:{len(expr)}: executing "" at <{expr}>: map has no entry for key "{part}"'
            )
    return cur


def _go_print(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "<no value>"
    if isinstance(v, list):
        return "[" + " ".join(_go_print(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_print(x)}" for k, x in sorted(v.items())) + "]"
    return str(v)


def render(template: str, obj: Any) -> str:
    """A tiny subset of Go text/template: `{{json .A.B}}` and `{{.A.B}}`."""

    def action(m: re.Match[str]) -> str:
        body = m.group(1)
        if body.startswith("json "):
            return json.dumps(_lookup(obj, body[5:].strip()), separators=(",", ":"))
        if body.startswith("."):
            return _go_print(_lookup(obj, body))
        raise TemplateError(f'template: :1: function "{body.split()[0]}" not defined')

    return _ACTION.sub(action, template)


def _find(g: Guest, ref: str) -> DockerContainer | None:
    for c in g.docker or []:
        if ref in (c.id, c.name, "/" + c.name) or (len(ref) >= 4 and c.id.startswith(ref)):
            return c
    return None


def run(g: Guest, args: list[str]) -> tuple[str, str, int]:
    now = time.time()
    if not args:
        return "", "Usage:  docker [OPTIONS] COMMAND\n", 0
    sub, rest = args[0], args[1:]
    if sub == "ps":
        return _ps(g, rest, now)
    if sub == "inspect":
        return _inspect(g, rest, now)
    if sub == "compose" and rest[:1] == ["ls"]:
        return _compose_ls(g, rest[1:])
    if sub in ("version", "info"):
        return "", "simulator: read-only docker supports ps, inspect, compose ls\n", 1
    return "", f"docker: '{sub}' is not a docker command.\nSee 'docker --help'\n", 1


def _opt(rest: list[str], name: str) -> str | None:
    for i, a in enumerate(rest):
        if a == name and i + 1 < len(rest):
            return rest[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _ps(g: Guest, rest: list[str], now: float) -> tuple[str, str, int]:
    show_all = "-a" in rest or "--all" in rest
    trunc = "--no-trunc" not in rest
    fmt = _opt(rest, "--format")
    rows = [c for c in g.docker or [] if show_all or c.state == "running"]
    out = []
    for c in rows:
        row = ps_row(c, now, trunc)
        if fmt in ("json", "{{json .}}"):
            out.append(json.dumps(row, separators=(",", ":")))
        elif fmt:
            try:
                out.append(render(fmt, row))
            except TemplateError as e:
                return "", f"{e}\n", 1
        else:
            out.append(
                f"{row['ID']:<14}{row['Image']:<24}{row['Command']:<24}{row['RunningFor']:<16}"
                f"{row['Status']:<28}{row['Ports']:<24}{row['Names']}"
            )
    if not fmt:
        out.insert(
            0, f"{'CONTAINER ID':<14}{'IMAGE':<24}{'COMMAND':<24}{'CREATED':<16}{'STATUS':<28}{'PORTS':<24}NAMES"
        )
    return ("\n".join(out) + "\n") if out else "", "", 0


def _inspect(g: Guest, rest: list[str], now: float) -> tuple[str, str, int]:
    fmt = _opt(rest, "--format") or _opt(rest, "-f")
    refs = []
    skip = False
    for a in rest:
        if skip:
            skip = False
            continue
        if a in ("--format", "-f", "--type"):
            skip = True
            continue
        if a.startswith("-"):
            continue
        refs.append(a)
    if not refs:
        return "", '"docker inspect" requires at least 1 argument.\n', 1
    out: list[str] = []
    objs: list[dict[str, Any]] = []
    err = ""
    for r in refs:
        c = _find(g, r)
        if c is None:
            err += f"Error: No such object: {r}\n"
            continue
        obj = inspect_obj(c, now)
        if fmt:
            try:
                out.append(render(fmt, obj))
            except TemplateError as e:
                return "", f"{e}\n", 1
        else:
            objs.append(obj)
    if not fmt:
        text = json.dumps(objs, indent=4) + "\n"
        return text, err, 1 if err else 0
    return ("\n".join(out) + "\n") if out else "", err, 1 if err else 0


def _compose_ls(g: Guest, rest: list[str]) -> tuple[str, str, int]:
    show_all = "-a" in rest or "--all" in rest
    projects: dict[str, dict[str, Any]] = {}
    for c in g.docker or []:
        p = c.labels.get("com.docker.compose.project")
        if not p:
            continue
        e = projects.setdefault(p, {"states": {}, "files": c.labels.get("com.docker.compose.project.config_files", "")})
        e["states"][c.state] = e["states"].get(c.state, 0) + 1
    rows = []
    for name, e in sorted(projects.items()):
        if not show_all and "running" not in e["states"]:
            continue
        status = ", ".join(f"{s}({n})" for s, n in sorted(e["states"].items()))
        rows.append({"Name": name, "Status": status, "ConfigFiles": e["files"]})
    fmt = _opt(rest, "--format")
    if fmt == "json":
        return json.dumps(rows, separators=(",", ":")) + "\n", "", 0
    lines = [f"{'NAME':<16}{'STATUS':<24}CONFIG FILES"] + [
        f"{r['Name']:<16}{r['Status']:<24}{r['ConfigFiles']}" for r in rows
    ]
    return "\n".join(lines) + "\n", "", 0
