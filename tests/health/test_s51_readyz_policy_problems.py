"""/readyz, which takes no credential, counts the policy data's problems; /admin/health lists them.

The public /readyz listed `checks.policy.catalog_problems` (each reference of the policy data the tool
catalog lacks) and the policy's own data problems in `checks.policy.detail` and `reasons`: rule paths,
tool names and arguments, the policy's internals, to anyone who can reach the port. It now says so in
the gateway's own short words ("policy data invalid, every call is refused: N problems (details in
/admin/health)", `catalog_problems` a count), and the admin token's /admin/health keeps the lists.

Real gateway, real OPA loading the broken data, the simulator.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gateway.policy.opa_sidecar import REPO_ROOT
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.health.test_catalog_references import _misspelled_reboot
from tests.support import GatewayThread, example_env

DETAILS = "details in /admin/health"


async def _admin_health(http: Any, base: str, env: Any) -> Any:
    token = env.config.admin.token.read()
    return await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {token}"})


async def test_readyz_counts_the_invalid_data_problems_admin_health_names_them(hsim: Any, tmp_path: Path) -> None:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree, ignore=shutil.ignore_patterns("golden", "*_test.rego"))
    data = tree / "data" / "data.yaml"
    data.write_text(data.read_text().replace("  protected_tags:", "  protected_tag:", 1))
    env = health_env(tmp_path / "gw", hsim, opa={"mode": "managed", "policies": [str(tree)]})
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(http, base + "/readyz", lambda r: r.json()["checks"]["policy"]["data_valid"] is False)
            assert r.status_code == 503, r.text
            assert "protected_tag" not in r.text and "guardrails" not in r.text, r.text  # the old code: both
            detail = r.json()["checks"]["policy"]["detail"]
            assert detail.startswith("policy data invalid, every call is refused: ") and DETAILS in detail, detail
            assert f"policy: {detail}" in r.json()["reasons"]
            admin = await _admin_health(http, base, env)
            assert admin.status_code == 503
            private = admin.json()["checks"]["policy"]["detail"]
            assert "guardrails.protected_tag: unknown key" in private, private
            problems = gw.components.decisions.data_check.problems  # type: ignore[union-attr]
            n = len(problems)
            counted = f"{n} problem{'' if n == 1 else 's'} ({DETAILS})"
            assert detail == f"policy data invalid, every call is refused: {counted}", detail
            assert private == "policy data invalid, every call is refused: " + "; ".join(problems), private
    finally:
        gw.stop()


async def test_readyz_counts_the_catalog_problems_admin_health_lists_them(hsim: Any, tmp_path: Path) -> None:
    env = example_env(tmp_path, hsim, _misspelled_reboot)
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(
                http, base + "/readyz", lambda r: r.json()["checks"]["policy"].get("catalog_problems") is not None
            )
            assert r.status_code == 200, r.text  # reported, not refused
            assert "node_rebot" not in r.text and "critical_calls" not in r.text, r.text  # the old code: both
            public = r.json()["checks"]["policy"]["catalog_problems"]
            admin = await _admin_health(http, base, env)
            listed = admin.json()["checks"]["policy"]["catalog_problems"]
            assert any("node_rebot" in p and "critical_calls" in p for p in listed), listed
            assert public == len(listed), (public, listed)
    finally:
        gw.stop()
