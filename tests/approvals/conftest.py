"""An approvals gateway: its own simulator (calls here change guest state), the real
policy library with test data that makes approval needs time-independent, the real
OPA sidecar, the real gateway."""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.support import GatewayThread, free_port

APPROVAL_RULES = [
    {
        "name": "test-prod-shutdown",
        "tools": ["vm_shutdown"],
        "target_tags": ["prod"],
        "reason": "shutting down a prod guest needs an SRE lead",
        "approver_groups": ["sre-leads"],
    },
    {
        "name": "test-two-person",
        "tools": ["vm_reboot"],
        "target_tags": ["prod"],
        "reason": "rebooting prod needs two approvers",
        "approver_groups": ["ops-approvers"],
        "min_approvals": 2,
    },
    {
        "name": "test-rehearsal-too",  # tests/mcp/test_s47_handoff_dry_run.py: a dry run needs its own approval
        "tools": ["vm_resume"],
        "target_tags": ["prod"],
        "reason": "resuming prod needs an approval, rehearsed or not",
        "approver_groups": ["sre-leads"],
        "include_dry_run": True,
    },
    {
        "name": "test-short-lived",
        "tools": ["vm_suspend"],
        "target_tags": ["prod"],
        "reason": "suspending prod needs an approval (short-lived)",
        "approver_groups": ["sre-leads"],
        "ttl_seconds": 2,
    },
]


def write_policy_data(root: Path) -> Path:
    """The repo's policy data with deterministic approval rules and generous quotas."""
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    data["approval"]["required_from_level"] = "critical"  # only the rules below ask, whatever the hour
    data["approval"]["rules"] = APPROVAL_RULES
    data["quotas"] = [{"name": "generous", "counter": "all", "window": "1m", "limit": 100000}]
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root


@pytest.fixture(scope="package")
def asim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("asim"), ssh=False)
    yield handle
    handle.stop()


def approvals_env(sim: Any, policy: Path, workdir: Path) -> DevEnv:
    """A gateway environment on `sim` whose managed OPA loads the repo's policies plus `policy`
    (its data, and any test rules beside it)."""
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    return make_env(workdir, {"default": sim}, port=free_port(), opa=opa)


@pytest.fixture(scope="package")
def aenv(asim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return approvals_env(asim, write_policy_data(tmp_path_factory.mktemp("apolicy")), tmp_path_factory.mktemp("agw"))


@pytest.fixture(scope="package")
def agw(aenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(aenv.config).start()
    yield gw
    gw.stop()


_ids = itertools.count(1)


class Api:
    """Raw HTTPS calls to the gateway: MCP JSON-RPC and the admin API."""

    def __init__(self, env: DevEnv) -> None:
        self.env = env
        self.base = env.url.rsplit("/mcp", 1)[0]
        self.ctx = ssl.create_default_context(cafile=str(env.ca_file))
        self.admin_token = (env.workdir / "secrets" / "admin-token").read_text().strip()

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(verify=self.ctx, timeout=30.0)

    def agent(self, sub: str = "demo-agent") -> str:
        return self.env.token(sub, ["operator"])

    def human(self, sub: str, groups: list[str] | None = None, roles: list[str] | None = None) -> str:
        return self.env.token(sub, roles or [], groups=groups or [], kind="human")

    async def call(
        self,
        token: str,
        tool: str,
        arguments: dict[str, Any],
        approval: str | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        if approval is not None:
            params["_meta"] = {"pvegate/approval": approval}
        body = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
        headers = {"Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-06-18"}
        own = http is None
        http = http or self.client()
        try:
            r = await http.post(self.env.url, json=body, headers=headers)
        finally:
            if own:
                await http.aclose()
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        assert "result" in doc, doc
        result: dict[str, Any] = doc["result"]
        return result

    async def admin(self, method: str, path: str, token: str | None, json_body: Any = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.client() as http:
            return await http.request(method, self.base + path, headers=headers, json=json_body)

    async def vote(self, approval_id: str, token: str, verdict: str = "approve") -> httpx.Response:
        return await self.admin("POST", f"/admin/approvals/{approval_id}/{verdict}", token, {"note": "test"})


@pytest.fixture(scope="package")
def api(agw: GatewayThread, aenv: DevEnv) -> Api:
    return Api(aenv)


def text(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result["content"])


def outcome(result: dict[str, Any]) -> str:
    return str(result["_meta"]["pvegate/outcome"])
