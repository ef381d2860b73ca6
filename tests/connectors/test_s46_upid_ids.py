"""A task id Proxmox writes is one the task tools take.

Proxmox names a prune's task `<vmid>@<storage>` (PruneBackups.pm) and a volume deletion's
`<vmid>@<storage>` (Content.pm), and a download's by its file name escaped with encode_text,
which keeps `+` and writes other unsafe characters as `%XX`. The `upid` parameter allowed only
letters, digits, `_`, `.` and `-` in the id: the UPID backup_prune itself returns, or
list_tasks lists, was refused by get_task_status, get_task_log, task_log_page and task_stop
("invalid argument upid"), so such a task could be neither followed nor stopped.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from tests.connectors.test_tools_e2e import auditor, call, text
from tests.support import GatewayThread


def _prune_task(sim: Any) -> str:
    """A prune that removes nothing (keep-all), started in Proxmox itself, not through the gateway."""
    tls = ssl.create_default_context(cafile=str(sim.ca_file))
    with httpx.Client(verify=tls, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}) as c:
        r = c.request(
            "DELETE",
            f"{sim.api_url}/nodes/pve2/storage/local/prunebackups",
            params={"prune-backups": "keep-all=1", "vmid": "103"},
        )
        assert r.status_code == 200, r.text
        upid = r.json()["data"]
    assert ":prunebackups:103@local:" in upid, upid
    return str(upid)


@pytest.mark.parametrize("tool", ["get_task_status", "get_task_log", "task_log_page"])
async def test_a_prunes_task_can_be_read(gateway: GatewayThread, env: DevEnv, sim: Any, tool: str) -> None:
    upid = _prune_task(sim)
    res = await call(env, auditor(env), tool, {"upid": upid})
    assert not res.is_error, text(res)
    assert res.meta["pvegate/outcome"] == "allowed", text(res)


@pytest.mark.parametrize(
    "task_id",
    ["103@local", "local-lvm", "101@local-lvm", "debian-13.1+nmu1-amd64.iso", "a%3Ab.iso", "", "networking"],
)
def test_worker_ids_proxmox_writes_are_valid_upids(task_id: str) -> None:
    tool = Catalog.load(REPO_ROOT / "connectors").tools["get_task_status"]
    upid = f"UPID:pve2:0001A2B3:00C0FFEE:6710ABCD:prunebackups:{task_id}:root@pam!pvegate:"
    assert tool.validate({"upid": upid})["upid"] == upid


@pytest.mark.parametrize("task_id", ["a/b", "a:b", "a b", "a\\b", "../x"])
def test_a_upid_still_holds_no_separator(task_id: str) -> None:
    tool = Catalog.load(REPO_ROOT / "connectors").tools["get_task_status"]
    upid = f"UPID:pve2:0001A2B3:00C0FFEE:6710ABCD:prunebackups:{task_id}:root@pam!pvegate:"
    with pytest.raises(Exception, match="upid"):
        tool.validate({"upid": upid})
