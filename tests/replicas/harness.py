"""Several `pvegate serve` replicas, each with its own managed OPA sidecar, sharing one real
PostgreSQL (tests/pgserver.py) and one simulator; a client that spreads calls across them.

Each replica is a separate process with its own configuration file (its own port, state
folder and OPA), as an operator would run them behind a load balancer; what they share is
`storage.url`, the JWT secret, the admin token and the TLS CA.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.core.config import load
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit_seal import HeadKey
from gateway.store.pgsync import PgLocation
from gateway.store.reconcile import open_calls
from tests.outcomes.helpers import Gateway
from tests.pgserver import PostgresServer
from tests.support import free_port

# Time-independent approval needs: only this rule asks (the default data's hour-based rules
# would make the test depend on the clock). The default quotas stay: agents make at most 10
# writes per tool per minute (agent-writes-per-minute).
APPROVAL_RULES = [
    {
        "name": "replicas-prod-shutdown",
        "tools": ["vm_shutdown"],
        "target_tags": ["prod"],
        "reason": "shutting down a prod guest needs an SRE lead",
        "approver_groups": ["sre-leads"],
    }
]
QUOTA_LIMIT = 10


def write_policy_data(root: Path) -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    data["approval"]["required_from_level"] = "critical"
    data["approval"]["rules"] = APPROVAL_RULES
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root


@dataclass
class Replica:
    n: int
    env: DevEnv
    gw: Gateway

    @property
    def base(self) -> str:
        return self.env.url.rsplit("/mcp", 1)[0]

    @property
    def pid(self) -> int:
        assert self.gw.proc is not None
        return self.gw.proc.pid


def replica_env(base: DevEnv, n: int, dsn: str, policy: Path) -> DevEnv:
    """Replica n's configuration: base's secrets and TLS, its own port, state folder and OPA."""
    raw = yaml.safe_load(base.config_path.read_text())
    port = free_port()
    raw["listen"]["port"] = port
    raw["public_url"] = f"https://127.0.0.1:{port}"
    raw["state_dir"] = str(base.workdir / f"state-{n}")
    # storage.url names the one database; the key that authenticates the chain's head is shared
    raw["audit"] = {"head_key_file": str(base.workdir / "audit-head.key")}
    raw["storage"] = {"url": dsn, "pool_max_size": 8}
    raw["opa"] = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    raw["shutdown_grace_seconds"] = 2
    path = base.workdir / f"replica-{n}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dataclasses.replace(base, config_path=path, config=load(path), url=f"https://127.0.0.1:{port}/mcp")


def unsettled(where: Path | PgLocation) -> list[str]:
    """Allowed calls whose outcome the audit does not hold, by reconciliation's own rule and SQL
    (reconcile.open_calls): a refusal after the decision settles a call; an `interrupted` or `running`
    result still waiting on reconciliation (`pending_reconcile: true`) does not."""
    return sorted(c.request_id for c in open_calls(where, None, None))


def pvegate(env: DevEnv, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, "--config", str(env.config_path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=timeout,
    )


@dataclass
class Answer:
    replica: int
    status: int
    doc: dict[str, Any] | None
    text: str

    @property
    def result(self) -> dict[str, Any]:
        return (self.doc or {}).get("result") or {}

    @property
    def outcome(self) -> str | None:
        meta = self.result.get("_meta") or {}
        return meta.get("pvegate/outcome")

    @property
    def request_id(self) -> str | None:
        return (self.result.get("_meta") or {}).get("pvegate/request_id")

    @property
    def error(self) -> dict[str, Any] | None:
        return (self.doc or {}).get("error")

    @property
    def words(self) -> str:
        return " ".join(c.get("text", "") for c in self.result.get("content") or [])


@dataclass
class Cluster:
    """The replicas, the shared database and simulator, and a client spreading calls round-robin."""

    pg: PostgresServer
    dsn: str
    sim: Any
    base: DevEnv
    policy: Path
    replicas: list[Replica]
    log_dir: Path
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def ctx(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.base.ca_file))

    def http(self, timeout: float = 60) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        return httpx.AsyncClient(verify=self.ctx, timeout=timeout, limits=limits)

    def agent(self, sub: str) -> str:
        return self.base.token(sub, ["operator"])

    def human(self, sub: str, groups: list[str]) -> str:
        return self.base.token(sub, [], groups=groups, kind="human")

    def next_replica(self) -> int:
        return next(self._turn) % len(self.replicas)

    async def call(
        self,
        http: httpx.AsyncClient,
        token: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        replica: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Answer:
        """One tools/call to replica `replica` (default: the next one in turn)."""
        n = self.next_replica() if replica is None else replica
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": "tools/call", "params": params}
        headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
        r = await http.post(self.replicas[n].env.url, json=body, headers=headers)
        try:
            doc = r.json()
        except ValueError:
            doc = None
        return Answer(n, r.status_code, doc, r.text)

    async def admin(
        self, http: httpx.AsyncClient, replica: int, method: str, path: str, token: str, body: Any = None
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return await http.request(method, self.replicas[replica].base + path, headers=headers, json=body)

    def launch(self, n: int, fault: str | None = None) -> Replica:
        """Start replica n's process on a fresh port (a killed process's port may be taken meanwhile),
        with a test-only fault (PVEGATE_TEST_FAULT) if given."""
        env = replica_env(self.base, n, self.dsn, self.policy)
        replica = Replica(n, env, Gateway(env, self.log_dir / f"replica-{n}.log", fault=fault).start())
        if n < len(self.replicas):
            self.replicas[n] = replica
        else:
            assert n == len(self.replicas)
            self.replicas.append(replica)
        return replica

    async def restart(self, n: int, fault: str | None = None) -> Replica:
        replica = self.launch(n, fault)
        await replica.gw.wait_up(timeout=90)
        return replica

    def stop(self) -> None:
        for r in self.replicas:
            r.gw.stop()

    def sim_posts(self, suffix: str, **body: Any) -> list[dict[str, Any]]:
        """The simulator's log of POSTs to paths ending in suffix whose body has these values."""
        return [
            r
            for r in self.sim.requests_log()
            if r["method"] == "POST"
            and r["path"].endswith(suffix)
            and all(str((r.get("body") or {}).get(k)) == str(v) for k, v in body.items())
        ]

    async def unsettled(self) -> list[str]:
        """The calls the shared audit holds open (unsettled), read off the event loop."""
        return await asyncio.to_thread(unsettled, PgLocation(self.dsn))

    def audit(self) -> list[dict[str, Any]]:
        """Every audit record, through `pvegate audit export` (whichever backend holds the chain)."""
        r = pvegate(self.replicas[0].env, "audit", "export", "--jsonl")
        assert r.returncode == 0, r.stderr
        return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


async def start_cluster(pg: PostgresServer, dsn: str, sim: Any, workdir: Path, count: int = 3) -> Cluster:
    base = make_env(workdir / "gw", {"default": sim}, port=free_port())
    HeadKey.create(base.workdir / "audit-head.key")  # one key for the one chain, before any replica starts
    policy = write_policy_data(workdir / "policy")
    cluster = Cluster(pg, dsn, sim, base, policy, [], workdir)
    first = replica_env(base, 0, dsn, policy)
    up = pvegate(first, "db", "upgrade")  # once per database, before any replica starts
    assert up.returncode == 0, up.stderr
    try:
        for n in range(count):
            cluster.launch(n)
        await asyncio.gather(*(r.gw.wait_up(timeout=90) for r in cluster.replicas))  # they start side by side
    except BaseException:
        cluster.stop()
        raise
    return cluster
