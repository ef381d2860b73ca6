"""Backup family end to end (restore, prune, jobs, schedules): SDK client -> HTTPS -> JWT ->
real OPA -> pve_api runtime -> simulator, with the example organisation's policy.

Each mutation runs as a human admin and must send exactly the request its YAML declares.
Calls the default policy holds (cluster-wide job changes are high risk) or denies
(restore in place and prune are destroy-class: maintenance window and an SRE lead's
approval) are proved unsent, then run through the gateway's runtime object.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

from gateway.dev.devenv import DevEnv
from tests.connectors.test_provision_e2e import API, admin, answered, call, config, guests, read, run, text
from tests.support import GatewayThread

BACKUP_TOOLS = {
    "vm_restore", "lxc_restore", "vm_restore_in_place", "lxc_restore_in_place", "backup_prune_preview",
    "backup_prune", "backup_job_get", "backup_job_included", "backup_schedule_preview", "backup_job_create",
    "backup_job_update", "backup_job_retention_set", "backup_job_delete",
}  # fmt: skip


async def backups_of(env: DevEnv, node: str, storage: str, vmid: int) -> list[str]:
    items = (await read(env, "list_storage_content", {"node": node, "storage": storage, "content": "backup"}))["items"]
    return [r["volid"] for r in sorted(items, key=lambda r: -int(r.get("ctime") or 0)) if r.get("vmid") == vmid]


async def test_restore_to_new_ids_and_in_place(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    archive = (await backups_of(env, "pve1", "local", 100))[0]
    # a restore copies the backed-up guest, as a clone copies its source: the web team's pool-scoped
    # binding may not copy prod's web01 into its own pool (target.backup_of), and nothing is sent
    sim.clear_logs()
    web_team = env.token("dave", [], groups=["team-web"], kind="human")
    copy = await call(env, web_team, "vm_restore", {"node": "pve1", "vmid": 152, "archive": archive, "pool": "web"})
    assert copy.is_error and "from a backup of guest 100 (pool prod)" in text(copy), text(copy)
    assert [e for e in sim.requests_log() if e["method"] != "GET"] == []
    await run(
        gateway, env, sim, "vm_restore", {"node": "pve1", "vmid": 190, "archive": archive, "storage": "local-lvm"},
        ("POST", f"{API}/pve1/qemu", {"vmid": "190", "archive": archive, "storage": "local-lvm", "unique": "1"}),
    )  # fmt: skip
    g = (await guests(env))[190]
    assert (g["name"], g["status"], g["maxdisk"]) == ("web01", "stopped", 32 << 30)
    cfg = await config(env, 190)
    assert cfg["scsi0"].startswith("local-lvm:vm-190-disk-")
    assert cfg["net0"] != (await config(env, 100))["net0"]  # unique: a new MAC address

    # the same id again without force is PVE's refusal, sent and answered
    res = await answered(env, "vm_restore", {"node": "pve1", "vmid": 190, "archive": archive})
    assert res.is_error and "already exists" in text(res)

    old_disk = cfg["scsi0"].split(",")[0]
    verdict = await run(
        gateway, env, sim, "vm_restore_in_place", {"vmid": 190, "archive": archive, "storage": "ssd"},
        ("POST", f"{API}/pve1/qemu", {"vmid": "190", "archive": archive, "storage": "ssd", "force": "1"}),
    )  # fmt: skip
    assert verdict in ("held", "denied")  # destroy-class in the example policy
    assert (await config(env, 190))["scsi0"].startswith("ssd:vm-190-disk-")
    assert old_disk not in str(sim.state())

    ct_archive = (await backups_of(env, "pve1", "pbs", 200))[0]  # pve1: the read tests pin pve2's containers
    await run(
        gateway, env, sim, "lxc_restore", {"node": "pve1", "vmid": 191, "archive": ct_archive, "storage": "local-lvm"},
        ("POST", f"{API}/pve1/lxc", {"vmid": "191", "ostemplate": ct_archive, "storage": "local-lvm",
                                      "restore": "1", "unique": "1", "unprivileged": "1"}),
    )  # fmt: skip
    assert (await guests(env))[191]["name"] == "docker01"
    # Proxmox takes `unprivileged` from the backup unless the call sets it: always set, so a
    # privileged container's backup never comes back as a privileged container
    assert str((await config(env, 191))["unprivileged"]) == "1"
    await run(
        gateway, env, sim, "lxc_restore_in_place", {"vmid": 191, "archive": ct_archive, "storage": "ssd"},
        ("POST", f"{API}/pve1/lxc", {"vmid": "191", "ostemplate": ct_archive, "storage": "ssd",
                                      "restore": "1", "force": "1"}),
    )  # fmt: skip
    assert (await config(env, 191))["rootfs"].startswith("ssd:vm-191-disk-")


async def test_prune_with_preview(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    args = {"node": "pve2", "storage": "local", "keep": "keep-last=1", "vmid": 103}
    before = (await read(env, "backup_prune_preview", args))["items"]
    marks = [r["mark"] for r in before]
    assert len(marks) >= 3 and marks.count("keep") == 1 and marks.count("remove") == len(marks) - 1
    newest = max(before, key=lambda r: r["ctime"])
    assert newest["mark"] == "keep"
    daily = (await read(env, "backup_prune_preview", {**args, "keep": "keep-daily=2"}))["items"]
    assert [r["mark"] for r in daily].count("keep") == 2  # three different days
    await run(
        gateway, env, sim, "backup_prune", args,
        ("DELETE", f"{API}/pve2/storage/local/prunebackups", None),
    )  # fmt: skip
    deletes = [e["query"] for e in sim.requests_log() if e["method"] == "DELETE"]
    assert [parse_qs(q) for q in deletes] == [{"prune-backups": ["keep-last=1"], "vmid": ["103"]}]
    assert await backups_of(env, "pve2", "local", 103) == [newest["volid"]]

    # a protected guest's backups are the protected guest's: its tag stops the prune, as a snapshot delete
    sim.clear_logs()
    res = await call(
        env, admin(env), "backup_prune", {"node": "pve1", "storage": "local", "keep": "keep-last=1", "vmid": 101}
    )
    assert res.is_error and "guardrail.protected_tag" in res.structured_content["codes"], text(res)
    assert [e for e in sim.requests_log() if e["method"] == "DELETE"] == []


async def test_backup_jobs_and_schedules(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    runs = (await read(env, "backup_schedule_preview", {"schedule": "sat 03:00", "iterations": 3}))["items"]
    assert len(runs) == 3 and all(time.gmtime(r["timestamp"]).tm_wday == 5 for r in runs)
    assert all(time.gmtime(r["timestamp"])[3:5] == (3, 0) for r in runs)
    assert runs[1]["timestamp"] - runs[0]["timestamp"] == 7 * 86400
    bad = await call(env, admin(env), "backup_schedule_preview", {"schedule": "someday 25:00"})
    assert bad.is_error and "unable to parse calendar event" in text(bad)

    job = {"id": "backup_sandbox", "schedule": "mon..fri 22:30", "storage": "pbs", "pool": "sandbox",
           "keep_all": True, "comment": "sandbox nightly"}  # fmt: skip
    await run(
        gateway, env, sim, "backup_job_create", job,
        ("POST", "/api2/json/cluster/backup", {"id": "backup_sandbox", "schedule": "mon..fri 22:30", "storage": "pbs",
                                               "pool": "sandbox", "prune-backups": "keep-all=1",
                                               "comment": "sandbox nightly", "compress": "zstd"}),
    )  # fmt: skip
    # a retention that deletes backups is destroy-class (every run prunes by it): its own tool
    verdict = await run(
        gateway, env, sim, "backup_job_retention_set", {"id": "backup_sandbox", "keep": "keep-daily=7,keep-weekly=4"},
        ("PUT", "/api2/json/cluster/backup/backup_sandbox", {"prune-backups": "keep-daily=7,keep-weekly=4"}),
    )  # fmt: skip
    assert verdict in ("held", "denied")
    got = await read(env, "backup_job_get", {"id": "backup_sandbox"})
    first = (await read(env, "backup_schedule_preview", {"schedule": "mon..fri 22:30", "iterations": 1}))["items"][0]
    assert got["next-run"] == first["timestamp"] and got["pool"] == "sandbox"
    included = await read(env, "backup_job_included", {"id": "backup_sandbox"})
    assert isinstance(included["children"], list)
    listed = {j["id"] for j in (await read(env, "list_backup_jobs", {}))["items"]}
    assert "backup_sandbox" in listed

    await run(
        gateway, env, sim, "backup_job_update", {"id": "backup_sandbox", "schedule": "sat 03:00", "enabled": False},
        ("PUT", "/api2/json/cluster/backup/backup_sandbox", {"schedule": "sat 03:00", "enabled": "0"}),
    )  # fmt: skip
    got = await read(env, "backup_job_get", {"id": "backup_sandbox"})
    assert got["schedule"] == "sat 03:00" and "next-run" not in got  # disabled: no next run
    await run(
        gateway, env, sim, "backup_job_delete", {"id": "backup_sandbox"},
        ("DELETE", "/api2/json/cluster/backup/backup_sandbox", None),
    )  # fmt: skip
    res = await call(env, admin(env), "backup_job_get", {"id": "backup_sandbox"})
    assert res.is_error and "does not exist" in text(res)
