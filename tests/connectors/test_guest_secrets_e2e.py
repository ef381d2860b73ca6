"""No secret leaves, end to end on a PVE 9.1 cluster (the simulator's `second` scenario): SDK
client -> HTTPS -> JWT -> real OPA (the repository's policy and example data) -> pve_api ->
simulator.

An admin edits Proxmox itself (the simulator's API, root token): an OCI container's
`entrypoint` and `env` (PVE 9.1), a VM's cloud-init `sshkeys`. The config readers never return
the connector's sensitive keys, and the policy's `redact` of `sshkeys` holds on the pending rows
as on the stored config (found in review: both came out of get_guest_pending). A vendor APT
repository's URI carries a password (the simulator lists one): node_apt_repositories and the
upgrade preflight built on it show the URI without it. Nothing reaches the audit either.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core.redaction import REDACTED
from gateway.dev.devenv import DevEnv, make_env
from gateway.sim.handlers_node import VENDOR_REPO_PASSWORD
from tests.connectors.test_provision_e2e import admin, call, text
from tests.support import GatewayThread, audit_bytes, free_port

ENTRYPOINT_SECRET = "EntrypointSecret-9f8e"
ENV_SECRET = "EnvSecret-1234abcd"
SSH_KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIGuestSecretKeyMaterialPlanted0000000000"
CONFIG_READERS = ("get_guest_config", "get_guest_stored_config", "get_guest_pending")


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    h = start_simulator("second", tmp_path_factory.mktemp("secrets-edge"), ssh=False)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def env(edge: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevEnv]:
    env = make_env(Path(tmp_path_factory.mktemp("secrets-gw")), {"default": edge}, port=free_port())
    gw = GatewayThread(env.config).start()
    yield env
    gw.stop()


async def pve_put(sim: Any, path: str, body: dict[str, str]) -> None:
    """What an admin does in Proxmox itself, not through the gateway."""
    tls = ssl.create_default_context(cafile=str(sim.ca_file))
    async with httpx.AsyncClient(verify=tls, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}) as h:
        r = await h.put(f"{sim.api_url}{path}", data=body)
        assert r.status_code == 200, r.text


async def answer(env: DevEnv, name: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The structured answer of a call as an admin, and everything the client received as text."""
    res = await call(env, admin(env), name, args)
    assert not res.is_error, text(res)
    structured = dict(res.structured_content or {})
    return structured, json.dumps(structured) + text(res)


async def test_a_containers_entrypoint_and_env_never_leave(env: DevEnv, edge: Any) -> None:
    entrypoint = f"/app/run --db-url=postgres://app:{ENTRYPOINT_SECRET}@db/app"
    await pve_put(edge, "/nodes/edge1/lxc/200/config", {"entrypoint": entrypoint, "env": f"API_TOKEN={ENV_SECRET}"})
    for name in CONFIG_READERS:
        doc, seen = await answer(env, name, {"vmid": 200})
        assert ENTRYPOINT_SECRET not in seen and ENV_SECRET not in seen, name
        keys = set(doc["config"]) if "config" in doc else {r["key"] for r in doc["items"]}
        assert not keys & {"entrypoint", "env"}, (name, keys)
        assert "hostname" in keys, (name, keys)  # the rest of the configuration is there
    raw, _ = audit_bytes(env.config.audit_path)
    assert ENTRYPOINT_SECRET.encode() not in raw and ENV_SECRET.encode() not in raw


async def test_the_policys_redaction_holds_on_pending_rows(env: DevEnv, edge: Any) -> None:
    """policies/data/data.yaml redacts config.sshkeys; the pending rows name the key instead."""
    await pve_put(edge, "/nodes/edge1/qemu/100/config", {"sshkeys": f"ssh-ed25519%20{SSH_KEY}%20ops%40corp"})
    stored, seen = await answer(env, "get_guest_stored_config", {"vmid": 100})
    assert stored["config"]["sshkeys"] == REDACTED and SSH_KEY not in seen
    pending, seen = await answer(env, "get_guest_pending", {"vmid": 100})
    assert SSH_KEY not in seen
    row = next(r for r in pending["items"] if r["key"] == "sshkeys")  # the change stays visible
    hidden = {k: row[k] for k in ("value", "pending") if k in row}
    assert hidden and set(hidden.values()) == {REDACTED}, row
    assert any(r["key"] == "name" and r["value"] == "edge-gw" for r in pending["items"])  # others untouched
    raw, _ = audit_bytes(env.config.audit_path)
    assert SSH_KEY.encode() not in raw


async def test_apt_repository_credentials_never_leave(env: DevEnv) -> None:
    doc, seen = await answer(env, "node_apt_repositories", {"node": "edge1"})
    assert VENDOR_REPO_PASSWORD not in seen
    uris = [u for f in doc["files"] for r in f["repositories"] for u in r["URIs"]]
    assert "https://***@repo.vendor.example/debian" in uris and "http://deb.debian.org/debian" in uris
    _, seen = await answer(env, "node_upgrade_preflight", {"node": "edge1"})
    assert VENDOR_REPO_PASSWORD not in seen
    raw, _ = audit_bytes(env.config.audit_path)
    assert VENDOR_REPO_PASSWORD.encode() not in raw
