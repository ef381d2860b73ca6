"""Start a simulator in a subprocess and hand tests a `SimHandle` (the stable interface)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass(frozen=True)
class SimNode:
    name: str
    ssh_host: str
    ssh_port: int
    host_key: str  # "ssh-ed25519 AAAA..." public key line to pin


@dataclass
class SimHandle:
    api_url: str
    ca_file: Path
    fingerprint: str
    tokens: dict[str, str]
    ssh_nodes: dict[str, SimNode]
    ssh_user: str
    ssh_client_key: Path
    admin_url: str
    process: subprocess.Popen[bytes] | None
    workdir: Path | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> None:
        _kill(self.process)
        self.process = None

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        r = httpx.request(method, self.admin_url + path, json=body, timeout=10.0)
        r.raise_for_status()
        return r.json()

    def requests_log(self) -> list[dict[str, Any]]:
        return list(self._admin("GET", "/requests"))

    def ssh_log(self) -> list[dict[str, Any]]:
        return list(self._admin("GET", "/ssh"))

    def ssh_running(self) -> list[dict[str, Any]]:
        """The SSH commands still running on the nodes (a client that closed the channel does not end them)."""
        return [e for e in self.ssh_log() if e.get("ended") is None]

    def clear_logs(self) -> None:
        self._admin("POST", "/clear")

    def set_faults(self, **faults: Any) -> None:
        self._admin("POST", "/faults", faults)

    def state(self) -> dict[str, Any]:
        return dict(self._admin("GET", "/state"))

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_live: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


def _kill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # own process group: nothing it spawned survives
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


@atexit.register
def _kill_all() -> None:
    for p in list(_live):
        _kill(p)


def start_simulator(
    scenario: str | Path = "small",
    workdir: Path | None = None,
    *,
    ssh: bool = True,
    timeout: float = 30.0,
) -> SimHandle:
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pvegate-sim-"))
    wd.mkdir(parents=True, exist_ok=True)
    ready = wd / "ready.json"
    ready.unlink(missing_ok=True)
    log_path = wd / "sim.log"
    cmd = [
        sys.executable,
        "-m",
        "gateway.sim",
        "--scenario",
        str(scenario),
        "--workdir",
        str(wd),
        "--ready-file",
        str(ready),
        "--api-port",
        "0",
        "--ssh-port-base",
        "0",
        "--quiet",  # connection info (with token secrets) goes to the ready file, not the log
        "--exit-with-parent",  # no orphan simulator if the caller dies without stopping it
        str(os.getpid()),
    ]
    if not ssh:
        cmd.append("--no-ssh")
    repo_root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo_root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    _live.add(proc)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"simulator exited with {proc.returncode}: {log_path.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            _kill(proc)
            raise TimeoutError(f"simulator not ready after {timeout}s: {log_path.read_text()[-4000:]}")
        time.sleep(0.02)
    info = json.loads(ready.read_text())
    nodes = {
        n: SimNode(name=n, ssh_host=d["ssh_host"], ssh_port=int(d["ssh_port"]), host_key=d["host_key"])
        for n, d in info["ssh_nodes"].items()
    }
    return SimHandle(
        api_url=info["api_url"],
        ca_file=Path(info["ca_file"]),
        fingerprint=info["fingerprint"],
        tokens=dict(info["tokens"]),
        ssh_nodes=nodes,
        ssh_user=info["ssh_user"],
        ssh_client_key=Path(info["ssh_client_key"]),
        admin_url=info["admin_url"],
        process=proc,
        workdir=wd,
        info=info,
    )
