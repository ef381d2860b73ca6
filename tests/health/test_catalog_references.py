"""A running gateway reports what its policy data names that its tool catalog lacks.

`node_rebot` instead of `node_reboot` in risk.critical_calls silently turns a four-eyes reboot
into a medium-risk one (a review reproduced it with `pvegate policy explain`). `pvegate policy
check` refuses such data; a gateway that is handed it anyway (a bundle built elsewhere, another
catalog) says so in its health and its log, once per policy revision, and refuses no call for it:
a bundle may serve gateways whose catalogs differ. Real gateway, real OPA, the simulator.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.health.conftest import base_url, http_client, wait_for
from tests.support import GatewayThread, example_env


def _misspelled_reboot(data: dict[str, Any]) -> None:
    for rule in data["risk"]["critical_calls"]:
        rule["tools"] = ["node_rebot" if t == "node_reboot" else t for t in rule.get("tools", [])]


async def test_a_misspelled_tool_in_the_data_shows_in_health(
    hsim: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = example_env(tmp_path, hsim, _misspelled_reboot)
    caplog.set_level(logging.WARNING, logger="pvegate.health")
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            r, _ = await wait_for(
                http, base + "/readyz", lambda r: r.json()["checks"]["policy"].get("catalog_problems") is not None
            )
            policy = r.json()["checks"]["policy"]
            # reported, not refused: the data is valid and the gateway is ready
            assert r.status_code == 200 and policy["ok"] is True and policy["data_valid"] is True, r.text
            token = env.config.admin.token.read()  # type: ignore[union-attr]
            admin = await http.get(base + "/admin/health", headers={"Authorization": f"Bearer {token}"})
            problems = admin.json()["checks"]["policy"]["catalog_problems"]  # listed for the admin token only
            assert any("node_rebot" in p and "critical_calls" in p for p in problems), admin.text
            assert policy["catalog_problems"] == len(problems), policy  # /readyz counts them
        assert any("node_rebot" in rec.getMessage() for rec in caplog.records), caplog.text
    finally:
        gw.stop()
