"""node_upgrade_preflight never reads an answer it cannot understand as "nothing to worry about".

`ready` is true only when every check ran and found no blocker (preflight.py). A pending-updates
list or a guest list that Proxmox (or a proxy) answered as something other than a list (a
string, an object) was read as an empty list: "0 package updates pending", "0 running guests",
and `ready: true` for a node whose running guests a reboot would take down. A repository answer
that was not an object, or a node status that was not one, failed the whole call instead of that
one check. Each must be a check that could not run, with why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, ToolOutput
from gateway.tools.runtimes.composite import CompositeRuntime
from gateway.tools.runtimes.pve_api import PveApiClient, PveApiRuntime
from gateway.tools.targets import TargetResolver
from tests.connectors.test_upstream_answers import Upstream, catalog, cluster, ok

__all__ = ["catalog"]  # the module-scoped catalog fixture

GOOD: dict[str, Any] = {
    "/nodes/pve1/apt/update": [],
    "/nodes/pve1/apt/repositories": {"files": [], "errors": [], "infos": [], "standard-repos": []},
    "/nodes/pve1/status": {"rootfs": {"total": 100 << 30, "used": 10 << 30, "avail": 90 << 30, "free": 90 << 30}},
    "/cluster/resources": [{"type": "node", "node": "pve1", "status": "online"}],
}


async def preflight(tmp_path: Path, catalog: Catalog, answers: dict[str, Any]) -> ToolOutput:
    def handler(method: str, path: str, headers: dict[str, str]) -> Any:
        return ok(answers[path]) if method == "GET" and path in answers else None

    up = Upstream(handler)
    async with up as url:
        client = PveApiClient(cluster(url, tmp_path))
        rt = PveApiRuntime({"default": client}, TargetResolver({"default": client}))
        comp = CompositeRuntime(catalog, {"pve_api": rt})
        try:
            tool = catalog.tools["node_upgrade_preflight"]
            return await comp.call(tool, {"node": "pve1"}, CallContext("default"))
        finally:
            await rt.close()


async def test_a_readable_node_is_ready(tmp_path: Path, catalog: Catalog) -> None:
    out = await preflight(tmp_path, catalog, GOOD)
    assert out.data["ready"] is True, out.data


@pytest.mark.parametrize(
    ("path", "answer", "check"),
    [
        ("/nodes/pve1/apt/update", "no updates today", "updates"),
        ("/nodes/pve1/apt/update", {"Package": "proxmox-kernel-6.8"}, "updates"),
        ("/cluster/resources", "all quiet", "guests"),
        ("/nodes/pve1/apt/repositories", ["not", "an", "object"], "repositories"),
        ("/nodes/pve1/status", "up", "root_filesystem"),
    ],
)
async def test_an_unreadable_answer_is_a_check_that_did_not_run(
    path: str, answer: Any, check: str, tmp_path: Path, catalog: Catalog
) -> None:
    out = await preflight(tmp_path, catalog, {**GOOD, path: answer})
    data = out.data
    assert data["ready"] is False, data
    row = next(c for c in data["checks"] if c["check"] == check)
    assert row["ran"] is False and row["ok"] is None, row
    assert any(b.startswith(f"{check} could not be checked") for b in data["blockers"]), data["blockers"]
    # the other checks still ran
    assert all(c["ran"] for c in data["checks"] if c["check"] != check), data["checks"]
