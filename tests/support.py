"""Test support: run the real gateway (uvicorn + managed OPA) in a background thread."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from gateway.components import Components
from gateway.core import processes
from gateway.core.config import Config
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import AUTHZ_POLICY, REPO_ROOT, find_opa, free_port
from gateway.server import uvicorn_config
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord

__all__ = ["ALLOWING_DECISION", "GatewayThread", "audit_rows", "database_bytes", "free_port"]

# A decision document inside the contract (decision.schema.json): an allowed low-risk read.
ALLOWING_DECISION: dict[str, Any] = {
    "contract_version": 1,
    "allow": True,
    "deny": [],
    "risk": {"score": 0, "level": "low", "factors": []},
    "approval": {
        "required": False,
        "satisfied": False,
        "approver_groups": [],
        "min_approvals": 0,
        "ttl_seconds": 0,
        "reason": "",
    },
    "obligations": {"dry_run": False, "redact": [], "max_items": 10},
    "quota": None,
}


class GatewayThread:
    """The gateway exactly as `pvegate serve` runs it, on its own loop in a thread."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.server = uvicorn.Server(uvicorn_config(config))
        self.server.config.install_signal_handlers = False  # type: ignore[attr-defined]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="pvegate-gateway")
        self.error: BaseException | None = None

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self.server.serve())
        except BaseException as exc:  # surfaced by start()
            self.error = exc

    def start(self, timeout: float = 60.0) -> GatewayThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.error is not None or not self.thread.is_alive():
                raise RuntimeError(f"gateway failed to start: {self.error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("gateway did not start")
            time.sleep(0.05)
        return self

    @property
    def components(self) -> Components:
        # the Starlette app as given to uvicorn (loaded_app may be wrapped in middleware, or not)
        comps: Components = self.server.config.app.state.components  # type: ignore[union-attr]
        return comps

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def audit_rows(db: Path, request_id: str | None = None) -> list[dict[str, Any]]:
    """Read audit rows straight from the SQLite file (what an operator would see)."""
    con = sqlite3.connect(db)
    try:
        con.row_factory = sqlite3.Row
        sql = "SELECT * FROM audit" + (" WHERE request_id = ?" if request_id else "") + " ORDER BY seq"
        return [dict(r) for r in con.execute(sql, (request_id,) if request_id else ())]
    finally:
        con.close()


def sqlite_exec(path: Path, *stmts: str) -> None:
    """Run SQL statements on a SQLite file and commit (the tamperer's hand on an audit database)."""
    con = sqlite3.connect(path)
    try:
        for s in stmts:
            con.execute(s)
        con.commit()
    finally:
        con.close()


def database_bytes(db: Path) -> bytes:
    """The raw bytes of a SQLite database and its -wal/-shm files, read by another process.

    Never open() a live database's files in this process: closing any descriptor of a file drops
    every POSIX lock the process holds on it, the gateway's SQLite locks included (sqlite.org,
    "How To Corrupt An SQLite Database File", 2.2). The next connection another process closes
    then takes itself for the last one, checkpoints and deletes the -wal and -shm the gateway
    still writes to, and every new connection here fails with "disk I/O error".
    """
    files = sorted(str(f) for f in db.parent.glob(db.name + "*"))
    return subprocess.run(["cat", *files], capture_output=True, check=True, timeout=60).stdout


def kept_input(row: dict[str, Any]) -> dict[str, Any] | None:
    """The policy input an audit record keeps (a decision's, compressed), unpacked; None for the others."""
    return auditlib.unpack_input(json.loads(row["body"])) if row["body"] else None


def audit_bytes(db: Path) -> tuple[bytes, list[dict[str, Any]]]:
    """Everywhere a secret could hide in the audit, as bytes: the database's files (database_bytes) and
    the policy inputs its decision records keep compressed, unpacked; with the rows (audit_rows)."""
    rows = audit_rows(db)
    raw = database_bytes(db) + b"".join(json.dumps(kept_input(r)).encode() for r in rows)
    return raw, rows


def per_module(sub: str) -> str:
    """`sub` with the running test module's name: a principal of its own per module.

    The example policy counts calls per principal per minute (calls-per-minute, 120). Helpers
    shared across the connectors package minted one admin for every module, and a fast full run
    (a quiet machine) spent that admin's 120 calls a minute across modules and failed one."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    module = Path(current.split("::", 1)[0]).stem.removeprefix("test_") if current else ""
    return f"{sub}-{module}" if module else sub


# a rate limit no test's load reaches (the example's 120 calls a minute, 10 writes a tool a minute
# for agents, run out in a fast run and turn a test about something else into a quota test)
GENEROUS_QUOTAS = [{"name": "generous", "counter": "all", "window": "1m", "limit": 100000}]


def example_policy(root: Path, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The `opa` settings for a managed sidecar with the repository's policy and its example data
    as `edit` changes it (written under root, validated by the policy's schema as usual)."""
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    edit(data)
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(root)],
    }


def example_env(tmp: Path, sim: Any, edit: Callable[[dict[str, Any]], None]) -> DevEnv:
    """A gateway's environment (not started) on `sim` as cluster `default`, whose policy is the
    repository's with its example data, rate limits no test reaches, and `edit` applied."""

    def edited(data: dict[str, Any]) -> None:
        data["quotas"] = GENEROUS_QUOTAS
        edit(data)

    return make_env(tmp / "gw", {"default": sim}, port=free_port(), opa=example_policy(tmp / "policy", edited))


def mutations(sim: Any) -> list[tuple[str, str]]:
    """The writes the simulator has been sent, in order: (method, path)."""
    return [(e["method"], e["path"]) for e in sim.requests_log() if e["method"] != "GET"]


def resource_facts(gw: GatewayThread, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The resource facts the gateway hands the policy for a call of `name` on cluster `default`,
    read as a call reads them (on the gateway's own loop)."""
    c = gw.components
    tool = c.catalog.get(name)
    assert tool is not None and gw.loop is not None

    async def run() -> dict[str, Any]:
        valid = tool.validate(args)
        target = await c.targets.resolve(tool, valid, "default")
        out = await c.targets.resources(tool, valid, "default", target)
        assert out is not None
        return out

    return dict(asyncio.run_coroutine_threadsafe(run(), gw.loop).result(timeout=60))


class ExternalOPA:
    """An OPA run as docker/compose.yaml runs the external one: a TCP port, token authentication and
    the `system.authz` API guard, the token in its environment. (The managed sidecar listens on a
    private Unix socket instead; this is what `opa.mode: external` talks to.) `guarded=False` runs
    it with no authentication at all: an OPA open to anyone, which the gateway must refuse."""

    def __init__(
        self, load: list[str], port: int | None = None, token: str | None = None, *, guarded: bool = True
    ) -> None:
        self.load = load  # what OPA loads: a bundle (`--bundle` ...) or policy paths
        self.port = port or free_port()
        self.token = token or secrets.token_urlsafe(32)
        self.guarded = guarded
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def policies(cls, policies: Path, **kwargs: Any) -> ExternalOPA:
        ignore = ["--ignore", "*_test.rego", "--ignore", "golden", "--ignore", ".*"]
        return cls([*ignore, str(AUTHZ_POLICY), str(policies)], **kwargs)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ExternalOPA:
        guard = ["--authentication=token", "--authorization=basic"] if self.guarded else []
        cmd = [str(find_opa()), "run", "--server", "--addr", f"127.0.0.1:{self.port}", "--skip-version-check",
               "--log-level", "error", *guard, *self.load]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", ""), "PVEGATE_OPA_TOKEN": self.token}
        self.process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"external OPA did not start: {cmd}")

    def stop(self) -> None:
        p, self.process = self.process, None
        processes.stop(p, grace=10)


async def filled_audit(path: Path, n: int = 5) -> None:
    """An audit database at `path` with `n` decision records, written by the gateway's own AuditLog."""
    log = AuditLog(path)
    await log.open()
    try:
        for i in range(n):
            await log.append(AuditRecord(f"req-{i}", "decision", "agent", "vm_stop", "default/qemu/101", "deny", {}))
    finally:
        await log.close()
