"""A volume deletion whose UPID was lost is matched to its own task only, by the worker id Proxmox gives
it (pve-storage API2/Storage/Content.pm, delete: `fork_worker('imgdel', "<ownervmid>@<storage>" or
"<storage>", ...)`, the owner being the guest the volume's name says owns it), never to another deletion's
task on the same node. The call's recorded target holds the owner (`volume_of`); a record that does not
say which guest owns the volume (a name it could not read, an older record) is settled `unverifiable`,
never from a task that may be another call's. `pvegate audit reconcile` against the simulator, whose task
list is the witness of what ran."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gateway.core.redaction import REDACTED
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.reconcile import VOLUME_TASK, OpenCall, WorkerIdUnknown, volume_worker_id
from gateway.tools.catalog import Catalog
from tests.outcomes.helpers import env_for, reconcile_all, reconciled, task_stopped

ISO = "local:iso/debian-12.7.0-amd64-netinst.iso"
TARGET = {"cluster": "default", "node": "pve2", "storage": "local"}


def _owner(volume: str, content: str | None, vmid: int | None) -> dict[str, Any]:
    """target.volume_of as targets.py records it (the owner as the cluster knew it is beside the point)."""
    return {"cluster": "default", "volume": volume, "content": content, "vmid": vmid, "node": None,
            "pool": None, "pool_known": True, "tags": [], "exists": None}  # fmt: skip


async def _write_open_calls(env: Any, calls: list[tuple[str, dict[str, Any], str]]) -> None:
    """received + decision (allow) of storage_volume_delete calls whose gateway died before it recorded
    Proxmox's answer: (request id, target, volume)."""
    log = AuditLog(env.config.audit_path, head_key=env.config.audit_key_path)
    await log.open()
    try:
        for rid, target, volume in calls:
            args = {"node": "pve2", "storage": "local", "volume": volume}
            body = {"target": target, "arguments": args, "effect": "destroy"}
            await log.append(
                AuditRecord(rid, "received", "crash-probe", "storage_volume_delete", "default/local", None, body),
                AuditRecord(rid, "decision", "crash-probe", "storage_volume_delete", "default/local", "allow", {}),
            )
    finally:
        await log.close()


def _client(sim: Any) -> httpx.Client:
    """The gateway's own token (as a gateway that died since sent the request)."""
    return httpx.Client(
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
        headers={"Authorization": "PVEAPIToken=" + sim.tokens["admin"]},
    )


def _backups_of(sim: Any, vmid: int) -> list[str]:
    with _client(sim) as c:
        r = c.get(f"{sim.api_url.rstrip('/')}/nodes/pve2/storage/local/content", params={"content": "backup"})
    assert r.status_code == 200, r.text[:300]
    return sorted(str(v["volid"]) for v in r.json()["data"] if v.get("vmid") == vmid)


async def _delete(sim: Any, volume: str) -> dict[str, Any]:
    with _client(sim) as c:
        r = c.delete(f"{sim.api_url.rstrip('/')}/nodes/pve2/storage/local/content/{quote(volume, safe='')}")
    assert r.status_code == 200, r.text[:300]
    upid = str(r.json()["data"])
    return await task_stopped(sim, upid)


def test_a_volume_deletions_task_type_is_the_one_matched_by_its_owner() -> None:
    tool = Catalog.load(REPO_ROOT / "connectors").get("storage_volume_delete")
    assert tool is not None and tool.task_types == (VOLUME_TASK,)
    assert {"volume_of", "storage"} <= set(tool.target), tool.target


def _call(target: dict[str, Any]) -> OpenCall:
    return OpenCall("r", 0.0, "p", "storage_volume_delete", None, target=target)


@pytest.mark.parametrize(
    ("volume_of", "want"),
    [
        (_owner("local:backup/vzdump-qemu-103-2024_05_01-02_00_03.vma.zst", "backup", 103), "103@local"),
        (_owner("local:vm-105-disk-0", "images", 105), "105@local"),
        (_owner(ISO, None, None), "local"),  # nobody's: the storage alone
        (_owner("local:images/vm-1-disk-0/vm-2-disk-0.raw", "images", None), None),  # whose, the name does not say
        (_owner(ISO, "images", REDACTED), None),
        (_owner(ISO, "images", True), None),
        ("edited", None),
        (None, None),
    ],
)
def test_a_volume_deletions_worker_id_is_its_owners_or_unknown(volume_of: Any, want: str | None) -> None:
    target = {**TARGET, "volume_of": volume_of}
    if want is not None:
        assert volume_worker_id(_call(target)) == want
        return
    with pytest.raises(WorkerIdUnknown):
        volume_worker_id(_call(target))


def test_a_volume_deletion_without_its_storage_is_unknown() -> None:
    with pytest.raises(WorkerIdUnknown):
        volume_worker_id(_call({"cluster": "default", "node": "pve2", "volume_of": _owner(ISO, None, None)}))


async def test_two_concurrent_deletions_are_each_settled_from_their_own_task(fsim: Any, tmp_path: Path) -> None:
    """Oldest first: the deletion of an ISO (nobody's: its task is `local`), then of one of guest 103's
    backups (`103@local`), neither with a UPID; the backup's task starts first. Each call gets its own
    task, never the earliest task on the node."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    backup = _backups_of(fsim, 103)[0]
    await _write_open_calls(
        env,
        [
            ("del-iso", {**TARGET, "volume_of": _owner(ISO, None, None)}, ISO),
            ("del-backup", {**TARGET, "volume_of": _owner(backup, "backup", 103)}, backup),
        ],
    )
    time.sleep(0.05)
    of_backup = await _delete(fsim, backup)
    time.sleep(1.1)  # a later start time (whole seconds): the backup's task is the earliest on the node
    of_iso = await _delete(fsim, ISO)
    assert (of_backup["id"], of_iso["id"]) == ("103@local", "local")  # PVE's worker ids (Content.pm)
    reconcile_all(env)
    got = reconciled(env.config.audit_path, "del-iso")
    assert (got["proxmox"], got["task_id"]) == ("ok", of_iso["upid"])
    got = reconciled(env.config.audit_path, "del-backup")
    assert (got["proxmox"], got["task_id"], got["found_by"]) == ("ok", of_backup["upid"], "task_list")


async def test_a_deletion_is_never_settled_from_another_deletions_task(fsim: Any, tmp_path: Path) -> None:
    """Another deletion's task on the node (one of guest 201's backups, `201@local`), none of this call's:
    a call deleting one of guest 103's backups is `not_found` (its request never started a task), one
    deleting the ISO too; a call whose record does not say which guest owns its volume (the name did not
    say unambiguously; no volume_of at all, an older record) is `unverifiable`, its task not looked for.
    The other task stays unclaimed."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    mine, other = _backups_of(fsim, 103)[0], _backups_of(fsim, 201)[0]
    odd = "local:images/vm-1-disk-0/vm-2-disk-0.raw"
    await _write_open_calls(
        env,
        [
            ("del-103", {**TARGET, "volume_of": _owner(mine, "backup", 103)}, mine),
            ("del-iso", {**TARGET, "volume_of": _owner(ISO, None, None)}, ISO),
            ("del-ambiguous", {**TARGET, "volume_of": _owner(odd, "images", None)}, odd),
            ("del-older", dict(TARGET), mine),
        ],
    )
    time.sleep(0.05)
    task = await _delete(fsim, other)
    assert task["id"] == "201@local", task
    reconcile_all(env)
    for rid in ("del-103", "del-iso"):
        got = reconciled(env.config.audit_path, rid)
        assert (got["proxmox"], got["task_id"]) == ("not_found", None), (rid, got)
    for rid in ("del-ambiguous", "del-older"):
        got = reconciled(env.config.audit_path, rid)
        assert (got["proxmox"], got["task_id"]) == ("unverifiable", None), (rid, got)
        assert "worker id" in got["reason"], got
