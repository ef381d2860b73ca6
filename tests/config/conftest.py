"""A minimal valid configuration on disk, and running the real `pvegate` command on it."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy.opa_sidecar import REPO_ROOT

PVEGATE = [sys.executable, "-m", "gateway.cli"]


def minimal(root: Path) -> dict[str, Any]:
    """The smallest configuration `pvegate serve` starts with (no Proxmox is contacted at start-up)."""
    secrets = root / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "pve-token").write_text("pvegate@pve!gw=00000000-0000-0000-0000-000000000000\n")
    (secrets / "jwt").write_text("a-test-signing-secret-of-some-length\n")
    for name in ("pve-token", "jwt"):  # the gateway's user's alone, as docs/deployment.md §4 has them
        (secrets / name).chmod(0o600)
    return {
        "listen": {"host": "127.0.0.1", "port": 8443},
        "tls": {"insecure_http": True},
        "auth": {"issuer": "test", "audience": "pvegate", "hs256_secret": {"file": "secrets/jwt"}},
        "clusters": [
            {"name": "default", "api_url": "https://127.0.0.1:9/api2/json", "token": {"file": "secrets/pve-token"}}
        ],
        "connectors_dir": str(REPO_ROOT / "connectors"),
        "state_dir": "state",
    }


def write(root: Path, raw: dict[str, Any], name: str = "pvegate.yaml") -> Path:
    path = root / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_pvegate(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    return subprocess.run(
        [*PVEGATE, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env, check=False
    )


@pytest.fixture
def base(tmp_path: Path) -> dict[str, Any]:
    return copy.deepcopy(minimal(tmp_path))
