"""Real `pvegate serve` subprocesses around a simulator: signals, restarts, a disk that fills."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.core import processes
from gateway.core.config import load
from gateway.dev.devenv import DevEnv, make_env
from tests.support import GENEROUS_QUOTAS, example_policy, free_port

REPO = Path(__file__).resolve().parents[2]


def env_for(tmp: Path, sim: Any, state_dir: Path | None = None, generous_quotas: bool = False, **extra: Any) -> DevEnv:
    """generous_quotas: the example policy with rate limits no load here reaches (a fast machine
    otherwise runs out of the agent's ten writes a tool a minute and every mutation is denied)."""
    state = state_dir or tmp / "state"
    raw: dict[str, Any] = {
        "state_dir": str(state),
        "audit": {"path": str(state / "audit.db"), "min_free_mb": 1},
        "shutdown_grace_seconds": 2,
    }
    raw.update(extra)
    opa = None
    if generous_quotas:
        opa = example_policy(tmp / "policy", lambda data: data.update(quotas=GENEROUS_QUOTAS))
    return make_env(tmp / "gw", {"default": sim}, port=free_port(), extra=raw, opa=opa)


def new_port(env: DevEnv) -> DevEnv:
    """The same gateway configuration on a fresh port: a restart right after a SIGKILL must not
    depend on the old port still being free (another process on the host may have taken it)."""
    raw = yaml.safe_load(env.config_path.read_text())
    port = free_port()
    raw["listen"]["port"] = port
    raw["public_url"] = f"https://127.0.0.1:{port}"
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dataclasses.replace(env, config=load(env.config_path), url=f"https://127.0.0.1:{port}/mcp")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


# Each Gateway's $TMPDIR, where its OPA's socket and config directories land instead of /tmp: a
# gateway SIGKILLed for good (no restart to reap them) leaves them there, and the session's end
# removes them all (tests/conftest.py). Short: the socket's path must fit in 108 bytes.
TMPDIRS: list[Path] = []


@dataclass
class Gateway:
    """One `pvegate serve` process (and the OPA sidecar it starts)."""

    env: DevEnv
    log: Path
    fault: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    opa_pids: list[int] = field(default_factory=list)
    tmpdir: Path | None = None

    def start(self) -> Gateway:
        environ = dict(os.environ)
        environ.pop("PVEGATE_TEST_FAULT", None)
        if self.tmpdir is None:
            self.tmpdir = Path(tempfile.mkdtemp(prefix="pvgt-"))
            TMPDIRS.append(self.tmpdir)
        environ["TMPDIR"] = str(self.tmpdir)
        if self.fault:
            environ["PVEGATE_TEST_FAULT"] = self.fault
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--config", str(self.env.config_path)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=environ,
            )
        return self

    async def wait_up(self, timeout: float = 60) -> Gateway:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        base = self.env.url.rsplit("/mcp", 1)[0]
        async with httpx.AsyncClient(verify=ctx(self.env), timeout=2) as http:
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, "gateway exited during start-up: " + self.log.read_text()[-3000:]
                try:
                    if (await http.get(base + "/healthz")).status_code == 200:
                        self.opa_pids = _children(self.proc.pid)
                        return self
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError("gateway did not come up")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.opa_pids = self.opa_pids or _children(self.proc.pid)
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the gateway, then the OPA sidecar it had started (orphaned by the kill)."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.reap()

    def reap(self) -> None:
        for pid in self.opa_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.opa_pids = []

    def stop(self) -> None:
        processes.stop(self.proc, grace=60)
        self.reap()


def ctx(env: DevEnv) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(env.ca_file))


@dataclass
class Answer:
    status: int
    content_type: str
    headers: dict[str, str]
    doc: dict[str, Any] | None  # None: not JSON
    text: str

    @property
    def outcome(self) -> str | None:
        return ((self.doc or {}).get("result") or {}).get("_meta", {}).get("pvegate/outcome")

    @property
    def request_id(self) -> str | None:
        return ((self.doc or {}).get("result") or {}).get("_meta", {}).get("pvegate/request_id")


async def call(env: DevEnv, token: str, tool: str, args: dict[str, Any], timeout: float = 60) -> Answer:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": tool, "arguments": args}}
    headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(verify=ctx(env), timeout=timeout) as http:
        r = await http.post(env.url, json=body, headers=headers)
    doc: dict[str, Any] | None
    try:
        doc = r.json()
    except ValueError:
        doc = None
    return Answer(r.status_code, r.headers.get("content-type", ""), dict(r.headers), doc, r.text)


def rows(db: Path, sql: str = "SELECT * FROM audit ORDER BY seq", args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        con.row_factory = sqlite3.Row
        out = []
        for r in con.execute(sql, args):
            d = dict(r)
            if "body" in d:
                d["body"] = json.loads(d["body"])
            out.append(d)
        return out
    finally:
        con.close()


def records(db: Path, request_id: str) -> list[dict[str, Any]]:
    return rows(db, "SELECT * FROM audit WHERE request_id = ? ORDER BY seq", (request_id,))


def request_ids(db: Path, tool: str) -> list[str]:
    got = rows(db, "SELECT request_id FROM audit WHERE kind = 'decision' AND outcome = 'allow' AND tool = ?", (tool,))
    return [r["request_id"] for r in got]


async def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def sim_tasks(sim: Any) -> list[dict[str, Any]]:
    """Every task the simulator ran or runs (its own state: the witness of what Proxmox did)."""
    st = sim.state()
    tasks = st.get("tasks")
    return list(tasks.values()) if isinstance(tasks, dict) else list(tasks or [])


async def task_stopped(sim: Any, upid: str) -> dict[str, Any]:
    """The simulator's task once it has stopped: what Proxmox ran, finished."""
    done: list[dict[str, Any]] = await wait_for(
        lambda: [t for t in sim_tasks(sim) if t["upid"] == upid and t["status"] == "stopped"], 20, upid
    )
    return done[0]


def reconciled(db: Path, rid: str) -> dict[str, Any]:
    """The body of the call's one result, which reconciliation recorded."""
    (res,) = [r for r in records(db, rid) if r["kind"] == "result"]
    assert res["outcome"] == "reconciled", res
    body: dict[str, Any] = res["body"]
    return body


def process_state(pid: int) -> str:
    """R running, S sleeping, T stopped (/proc/<pid>/stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def posts(sim: Any, suffix: str) -> list[dict[str, Any]]:
    return [r for r in sim.requests_log() if r["method"] == "POST" and r["path"].endswith(suffix)]


def verify(env: DevEnv) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "verify", "--config", str(env.config_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def reconcile_cli(env: DevEnv, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "reconcile", "--config", str(env.config_path), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def reconcile_all(env: DevEnv) -> None:
    """`pvegate audit reconcile` of every open call, whatever its age; each must be settled."""
    done = reconcile_cli(env, "--min-age", "0s", "--json")
    assert done.returncode == 0, done.stdout + done.stderr


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "24m") -> Iterator[Path]:
    """A small filesystem of its own (a real ENOSPC), or skip when mounting is not permitted."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root / CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(path: Path) -> Path:
    """Write a ballast file until the filesystem is full (unbuffered: no data left over to flush)."""
    ballast = path / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 65536, 4096, 512, 1):  # big steps, then the last bytes
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return ballast
