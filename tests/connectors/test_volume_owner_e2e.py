"""A volume deleted by its id is decided on the guest it belongs to (target.volume_of), end to
end: SDK client -> HTTPS -> JWT -> gateway -> real OPA (the repository's policy and example
data, the maintenance window always open) -> simulator.

Proxmox deletes any volume it is asked to, a disk its guest still uses included (pve-storage's
Content.pm delete -> vdisk_free: only a template's base image that linked clones use is
refused, and a protected backup). So the policy refuses a protected guest's volumes and an
existing guest's disks for everyone, before Proxmox hears of them; an orphan disk (its guest
gone) is still deleted, after an SRE lead's approval like any destroy.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api
from tests.support import GatewayThread, example_env, mutations

ALWAYS = [
    {"name": "always", "weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "from_hour": 0, "to_hour": 24}
]
CONTENT = "/api2/json/nodes/{node}/storage/{storage}/content/{volume}"


@pytest.fixture(scope="module")
def vsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("vsim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def venv(vsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    def edit(data: dict[str, Any]) -> None:
        data["guardrails"]["maintenance_windows"] = ALWAYS  # the clock refuses nothing here

    return example_env(tmp_path_factory.mktemp("vgw"), vsim, edit)


@pytest.fixture(scope="module")
def vgw(venv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(venv.config).start()
    yield gw
    gw.stop()


def admin(env: DevEnv) -> str:
    return env.token("vol-admin", [], groups=["pve-admins"], kind="human")  # binding `admins`: role admin


def text(res: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in res.content)


async def call(env: DevEnv, name: str, args: dict[str, Any], approval: str | None = None) -> Any:
    async with mcp_client(env.url, admin(env), env.ca_file) as client:
        meta = {"pvegate/approval": approval} if approval else None
        return await client.call_tool(name, args, meta=meta)


async def volumes(env: DevEnv, node: str, storage: str) -> set[str]:
    res = await call(env, "list_storage_content", {"node": node, "storage": storage})
    assert not res.is_error, text(res)
    return {r["volid"] for r in res.structured_content["items"]}


def config(sim: Any, vmid: int) -> dict[str, Any]:
    return dict(sim.state()["guests"][str(vmid)]["config"])


async def refused(env: DevEnv, sim: Any, name: str, args: dict[str, Any], codes: set[str]) -> str:
    """The call is denied outright (no approval offered) with `codes`, and nothing is sent."""
    sim.clear_logs()
    res = await call(env, name, args)
    assert res.is_error and (res.meta or {}).get("pvegate/outcome") == "denied", text(res)
    assert codes <= set(res.structured_content["codes"]), res.structured_content
    assert "approval" not in res.structured_content
    assert mutations(sim) == []  # Proxmox never heard of it
    return text(res)


async def test_protected_guest_volumes_are_never_deleted(vgw: GatewayThread, venv: DevEnv, vsim: Any) -> None:
    # db01 (101) carries the protected tag; its disk is local-lvm:vm-101-disk-0 on pve1
    disk = str(config(vsim, 101)["scsi0"]).split(",")[0]
    assert disk == "local-lvm:vm-101-disk-0"
    args = {"node": "pve1", "storage": "local-lvm", "volume": disk}
    why = await refused(venv, vsim, "storage_volume_delete", args, {"guardrail.protected_tag", "guardrail.guest_disk"})
    assert f'volume {disk} belongs to guest 101, which is tagged "protected"' in why
    assert disk in await volumes(venv, "pve1", "local-lvm")

    # its backups neither: not deleted, not unprotected
    backup = next(v for v in await volumes(venv, "pve1", "pbs") if "/vm/101/" in v)
    args = {"node": "pve1", "storage": "pbs", "volume": backup}
    await refused(venv, vsim, "storage_volume_delete", args, {"guardrail.protected_tag"})
    why = await refused(venv, vsim, "storage_volume_set", {**args, "protected": False}, {"guardrail.protected_tag"})
    assert "never unprotected" in why
    assert backup in await volumes(venv, "pve1", "pbs")


async def test_an_existing_guests_disk_is_refused(vgw: GatewayThread, venv: DevEnv, vsim: Any) -> None:
    # win-build (102, tags [dev]) exists: its disk goes through its configuration, not the storage
    disk = str(config(vsim, 102)["scsi0"]).split(",")[0]
    args = {"node": "pve2", "storage": "local-lvm", "volume": disk}
    why = await refused(venv, vsim, "storage_volume_delete", args, {"guardrail.guest_disk"})
    assert f"volume {disk} belongs to guest 102, which exists: detach/remove it through the guest's config" in why
    assert disk in await volumes(venv, "pve2", "local-lvm")
    assert str(config(vsim, 102)["scsi0"]).startswith(disk)


async def test_an_orphan_disk_is_deleted_after_approval(vgw: GatewayThread, venv: DevEnv, vsim: Any) -> None:
    # a disk left behind by a guest that no longer exists (allocated in Proxmox itself)
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(vsim.ca_file))) as http:
        r = await http.post(
            f"{vsim.api_url}/nodes/pve1/storage/local-lvm/content",
            data={"vmid": "777", "filename": "vm-777-disk-0", "size": "1G"},
            headers={"Authorization": f"PVEAPIToken={vsim.tokens['admin']}"},
        )
    assert r.status_code == 200, r.text
    orphan = "local-lvm:vm-777-disk-0"
    assert orphan in await volumes(venv, "pve1", "local-lvm") and "777" not in vsim.state()["guests"]
    args = {"node": "pve1", "storage": "local-lvm", "volume": orphan}

    vsim.clear_logs()
    res = await call(venv, "storage_volume_delete", args)
    assert (res.meta or {}).get("pvegate/outcome") == "pending_approval", text(res)  # a destroy: an SRE lead
    assert mutations(vsim) == []
    api = Api(venv)
    vote = await api.vote(res.structured_content["approval"]["id"], api.human("vol-alice", ["sre-leads"]))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    res = await call(venv, "storage_volume_delete", args, approval=vote.json()["token"])
    assert not res.is_error, text(res)
    path = CONTENT.format(node="pve1", storage="local-lvm", volume=orphan)
    assert mutations(vsim) == [("DELETE", path)], mutations(vsim)
    assert orphan not in await volumes(venv, "pve1", "local-lvm")


async def set_tags(sim: Any, node: str, vmid: int, tags: str) -> None:
    """Tags set in Proxmox itself (an admin in the web UI), not through the gateway."""
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(sim.ca_file))) as http:
        r = await http.put(
            f"{sim.api_url}/nodes/{node}/qemu/{vmid}/config",
            data={"tags": tags},
            headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"},
        )
    assert r.status_code == 200, r.text


async def test_a_prune_never_deletes_a_protected_guests_backups(vgw: GatewayThread, venv: DevEnv, vsim: Any) -> None:
    """Without a guest named, a prune reaches every guest's backups on the storage: it is decided on
    the guests whose backups Proxmox's preview marks for removal (target.prune_removes)."""
    wide = {"node": "pve2", "storage": "local", "keep": "keep-last=1"}  # dev-scratch (103) has three backups
    vsim.clear_logs()
    res = await call(venv, "backup_prune", wide)
    assert (res.meta or {}).get("pvegate/outcome") == "pending_approval", text(res)  # a destroy, as any other
    assert mutations(vsim) == []
    await set_tags(vsim, "pve2", 103, "dev;protected")
    try:
        why = await refused(venv, vsim, "backup_prune", wide, {"guardrail.protected_tag"})
        assert 'the prune would delete backups of guest 103, which is tagged "protected"' in why, why
        # a retention that keeps every one of its backups reaches none of them: only the approval is asked
        res = await call(venv, "backup_prune", {**wide, "keep": "keep-last=5"})
        assert (res.meta or {}).get("pvegate/outcome") == "pending_approval", text(res)
        # what it would delete cannot be read: refused, not guessed
        vsim.set_faults(error_rate=1.0, error_path=r"/prunebackups$")
        try:
            why = await refused(venv, vsim, "backup_prune", wide, {"guardrail.prune_unknown"})
        finally:
            vsim.set_faults(error_rate=0.0, error_path=None)
        assert "could not be checked" in why
    finally:
        await set_tags(vsim, "pve2", 103, "dev")
    assert len([v for v in await volumes(venv, "pve2", "local") if "-103-" in v]) == 3  # nothing was pruned
