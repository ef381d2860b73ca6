"""A complete local environment around a running simulator: secrets, TLS, config.

Used by `pvegate demo`, the end-to-end tests and the benchmarks, so all three run
the same configuration a user would write by hand.
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gateway.auth.tokens import mint_hs256
from gateway.core.config import Config, load
from gateway.dev.devcerts import make_dev_tls

if TYPE_CHECKING:
    from gateway.sim.harness import SimHandle

ISSUER = "pvegate-dev"
AUDIENCE = "pvegate-mcp"
SHIPPED_CONNECTORS = Path(__file__).resolve().parents[2] / "connectors"


@dataclass
class DevEnv:
    workdir: Path
    config_path: Path
    config: Config
    ca_file: Path
    url: str
    jwt_secret: str

    def token(self, sub: str, roles: list[str], **kw: Any) -> str:
        return mint_hs256(self.jwt_secret, issuer=ISSUER, audience=AUDIENCE, sub=sub, roles=roles, **kw)


def _write_secret(path: Path, value: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def cluster_entry(name: str, sim: SimHandle, secrets_dir: Path, token_name: str = "admin") -> dict[str, Any]:  # noqa: S107 - a scenario token name, not a secret
    token_file = _write_secret(secrets_dir / f"{name}-pve-token", sim.tokens[token_name])
    entry: dict[str, Any] = {
        "name": name,
        "api_url": sim.api_url,
        "token": {"file": str(token_file)},
        "ca_file": str(sim.ca_file),
    }
    if sim.ssh_nodes:
        entry["ssh"] = {
            "user": sim.ssh_user,
            "key_file": str(sim.ssh_client_key),
            "nodes": {
                n.name: {"host": n.ssh_host, "port": n.ssh_port, "host_key": n.host_key} for n in sim.ssh_nodes.values()
            },
        }
    return entry


def make_env(
    workdir: Path,
    sims: dict[str, SimHandle],
    *,
    port: int = 8443,
    opa: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> DevEnv:
    workdir.mkdir(parents=True, exist_ok=True)
    secrets_dir = workdir / "secrets"
    ca, cert, key = make_dev_tls(workdir / "tls")
    jwt_file = secrets_dir / "jwt-hs256"
    if not jwt_file.exists():
        _write_secret(jwt_file, secrets.token_urlsafe(48))
    admin_file = secrets_dir / "admin-token"
    if not admin_file.exists():
        _write_secret(admin_file, secrets.token_urlsafe(32))
    raw: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "tls": {"cert": str(cert), "key": str(key)},
        "auth": {
            "issuer": ISSUER,
            "audience": AUDIENCE,
            "hs256_secret": {"file": str(jwt_file)},
            "algorithms": ["HS256"],
        },
        "opa": opa or {"mode": "managed"},
        "admin": {"token": {"file": str(admin_file)}},
        "clusters": [cluster_entry(name, sim, secrets_dir) for name, sim in sims.items()],
        "connectors_dir": str(SHIPPED_CONNECTORS),
        "state_dir": str(workdir / "state"),
        # Every auth failure its own audit row here (production: 20 per client address and minute, the rest
        # counted and summarised): tests send many from 127.0.0.1 and check each one's record.
        # tests/audit/test_auth_failure_bound.py sets the bound back and checks it.
        "audit": {"path": str(workdir / "state" / "audit.db"), "auth_failure_rows_per_minute": 100_000},
        # Likewise every test principal's refused calls audited one by one and its calls never held at its
        # door (production: 120 refused calls a minute, 32 in flight per principal): tests send many denied
        # calls from one token. tests/mcp/test_principal_limits.py sets them back and checks them.
        "refused_calls_per_minute_per_principal": 100_000,
        "max_inflight_per_principal": 10_000,
        "public_url": f"https://127.0.0.1:{port}",
        # The background cluster probe (GET /version every 15 s) is off here: tests prove what calls
        # send to Proxmox from the simulator's request log, and the probe's requests are not calls.
        # tests/health and the demo turn it on.
        "health": {"cluster_probe_interval": 0},
    }
    raw.update(extra or {})
    config_path = workdir / "pvegate.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return DevEnv(
        workdir=workdir,
        config_path=config_path,
        config=load(config_path),
        ca_file=ca,
        url=f"https://127.0.0.1:{port}/mcp",
        jwt_secret=jwt_file.read_text().strip(),
    )


def synthetic_connectors(dest: Path, n: int) -> Path:
    """The shipped connector files plus `n` generated read tools (never shipped), at `dest`: a catalog as
    large as the benchmark's tools/list measures, for it and the tests that watch that listing. A principal
    that may read node inventory sees all of them."""
    shutil.copytree(SHIPPED_CONNECTORS, dest)
    tools = [
        {
            "name": f"synthetic_read_{i:03d}",
            "title": f"Synthetic read {i}",
            "description": "Generated for a benchmark or test, not shipped: lists the cluster nodes.",
            "domain": "node",
            "effect": "read",
            "scope": "cluster",
            "tags": ["inventory"],
            "pve_api": {"method": "GET", "path": "/nodes"},
            "output": {"list": True, "fields": ["node", "status"]},
        }
        for i in range(n)
    ]
    (dest / "zz-synthetic.yaml").write_text(yaml.safe_dump({"tools": tools}, sort_keys=False))
    return dest
