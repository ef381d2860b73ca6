"""Mutations: UPIDs, task lifecycle, state change on finish, PVE-like conflicts."""

from __future__ import annotations

import time
from typing import Any

from gateway.sim.harness import SimHandle
from gateway.sim.tasks import UPID_RE

from .conftest import Api, api


def wait_task(a: Api, upid: str, timeout: float = 10.0) -> dict[str, Any]:
    node = upid.split(":")[1]
    deadline = time.monotonic() + timeout
    while True:
        st: dict[str, Any] = a.data(f"/nodes/{node}/tasks/{upid}/status")
        if st["status"] == "stopped" or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def upid_of(r: Any) -> str:
    assert r.status_code == 200, r.text
    upid = r.json()["data"]
    assert UPID_RE.match(upid), upid
    return str(upid)


def test_start_lifecycle(simw: SimHandle) -> None:
    a = api(simw)
    assert a.data("/nodes/pve2/qemu/102/status/current")["status"] == "stopped"
    upid = upid_of(a.post("/nodes/pve2/qemu/102/status/start"))
    parts = upid.split(":")
    assert parts[1] == "pve2" and parts[5] == "qmstart" and parts[6] == "102" and parts[7] == "root@pam!pvegate"
    st = a.data(f"/nodes/pve2/tasks/{upid}/status")
    assert st["status"] == "running" and "exitstatus" not in st
    assert a.data("/nodes/pve2/qemu/102/status/current")["status"] == "stopped"  # not yet
    # PVE's default task list (source=archive) only shows finished tasks
    assert upid not in [t["upid"] for t in a.data("/nodes/pve2/tasks")]
    assert upid in [t["upid"] for t in a.data("/nodes/pve2/tasks", params={"source": "active"})]
    st = wait_task(a, upid)
    assert st["status"] == "stopped" and st["exitstatus"] == "OK"
    cur = a.data("/nodes/pve2/qemu/102/status/current")
    assert cur["status"] == "running" and cur["uptime"] >= 0 and cur["qmpstatus"] == "running"
    tasks = a.data("/nodes/pve2/tasks", params={"vmid": 102})
    assert tasks[0]["upid"] == upid and tasks[0]["status"] == "OK" and "endtime" in tasks[0]
    log = a.get(f"/nodes/pve2/tasks/{upid}/log").json()
    assert log["data"][-1]["t"] == "TASK OK" and log["total"] == len(log["data"])
    assert upid in [t["upid"] for t in a.data("/cluster/tasks")]


def test_conflicts(simw: SimHandle) -> None:
    a = api(simw)
    # QEMU: checked inside the worker -> the task fails
    st = wait_task(a, upid_of(a.post("/nodes/pve1/qemu/101/status/start")))
    assert st["exitstatus"] == "VM 101 already running"
    # LXC: checked before forking -> HTTP 500
    r = a.post("/nodes/pve2/lxc/201/status/start")
    assert r.status_code == 500 and r.json()["message"] == "CT 201 already running\n"
    r = a.post("/nodes/pve2/lxc/202/status/shutdown")
    assert r.status_code == 500 and r.json()["message"] == "CT 202 not running\n"
    # lock held by a running snapshot task
    first = upid_of(a.post("/nodes/pve1/qemu/101/snapshot", data={"snapname": "one"}))
    assert a.data("/nodes/pve1/qemu/101/config")["lock"] == "snapshot"
    res = next(r for r in a.data("/cluster/resources", params={"type": "vm"}) if r["vmid"] == 101)
    assert res["lock"] == "snapshot"
    second = wait_task(a, upid_of(a.post("/nodes/pve1/qemu/101/snapshot", data={"snapname": "two"})))
    assert second["exitstatus"] == "VM is locked (snapshot)"
    assert wait_task(a, first)["exitstatus"] == "OK"
    assert "lock" not in a.data("/nodes/pve1/qemu/101/config")
    # protection and running guests cannot be deleted
    r = a.req("DELETE", "/nodes/pve1/qemu/101")
    assert r.status_code == 500 and "protection mode enabled" in r.json()["message"]
    r = a.post("/nodes/pve1/qemu/9000/status/start")
    assert r.status_code == 500 and "template" in r.json()["message"]
    r = a.post("/nodes/pve1/qemu/100/migrate", data={"target": "pve3"})
    assert r.status_code == 500 and "not online" in r.json()["message"]


def test_snapshot_create_rollback_delete(simw: SimHandle) -> None:
    a = api(simw)
    base = "/nodes/pve1/lxc/200"
    assert (
        wait_task(a, upid_of(a.post(f"{base}/snapshot", data={"snapname": "t1", "description": "d"})))["exitstatus"]
        == "OK"
    )
    names = [s["name"] for s in a.data(f"{base}/snapshot")]
    assert names[-2:] == ["t1", "current"]
    r = a.post(f"{base}/snapshot", data={"snapname": "current"})
    assert r.status_code == 500
    upid = upid_of(a.post(f"{base}/snapshot/t1/rollback"))
    assert upid.split(":")[5] == "vzrollback"
    wait_task(a, upid)
    assert a.data(f"{base}/status/current")["status"] == "stopped"  # rollback without vmstate stops the CT
    upid = upid_of(a.req("DELETE", f"{base}/snapshot/t1"))
    assert upid.split(":")[5] == "vzdelsnapshot"
    wait_task(a, upid)
    assert "t1" not in [s["name"] for s in a.data(f"{base}/snapshot")]
    st = wait_task(a, upid_of(a.req("DELETE", f"{base}/snapshot/nope")))
    assert st["exitstatus"] == "snapshot 'nope' does not exist"


def test_ha_managed_start_stop(simw: SimHandle) -> None:
    a = api(simw)
    upid = upid_of(a.post("/nodes/pve2/lxc/201/status/stop"))
    assert upid.split(":")[5] == "hastop"
    wait_task(a, upid)
    assert a.data("/nodes/pve2/lxc/201/status/current")["status"] == "stopped"
    res = next(r for r in a.data("/cluster/ha/resources") if r["sid"] == "ct:201")
    assert res["state"] == "stopped"


def test_vzdump_creates_backup(simw: SimHandle) -> None:
    op = api(simw, "operator")
    before = op.data("/nodes/pve1/storage/pbs/content", params={"content": "backup", "vmid": 100})
    upid = upid_of(
        op.post(
            "/nodes/pve1/vzdump",
            data={"vmid": "100", "storage": "pbs", "mode": "snapshot", "notes-template": "{{guestname}}"},
        )
    )
    assert upid.split(":")[5] == "vzdump" and upid.split(":")[7] == "ops@pve!operator"
    assert wait_task(op, upid)["exitstatus"] == "OK"
    after = op.data("/nodes/pve1/storage/pbs/content", params={"content": "backup", "vmid": 100})
    assert len(after) == len(before) + 1 and any(v.get("notes") == "web01" for v in after)
    r = op.post("/nodes/pve1/vzdump", data={"vmid": "100", "storage": "local"})
    assert (
        r.status_code == 403
        and r.json()["message"] == "Permission check failed (/storage/local, Datastore.AllocateSpace)\n"
    )
    r = op.post("/nodes/pve2/vzdump", data={"vmid": "102", "storage": "pbs"})
    assert r.status_code == 403 and "/vms/102" in r.json()["message"]


def test_migrate_clone_config_delete(simw: SimHandle) -> None:
    a = api(simw)
    wait_task(a, upid_of(a.post("/nodes/pve2/lxc/202/migrate", data={"target": "pve1"})))
    assert a.data("/nodes/pve1/lxc/202/status/current")["status"] == "stopped"
    assert a.get("/nodes/pve2/lxc/202/status/current").status_code == 500
    r = a.post("/nodes/pve1/qemu/100/migrate", data={"target": "pve2"})
    assert r.status_code == 500 and "--online" in r.json()["message"]
    upid = upid_of(a.post("/nodes/pve1/qemu/9000/clone", data={"newid": 150, "name": "from-tmpl", "full": 1}))
    assert a.data("/nodes/pve1/qemu/150/config")["lock"] == "create"
    wait_task(a, upid)
    cfg = a.data("/nodes/pve1/qemu/150/config")
    assert cfg["name"] == "from-tmpl" and "lock" not in cfg and "template" not in cfg
    r = a.req("PUT", "/nodes/pve1/qemu/150/config", data={"memory": "2048", "tags": "dev;new", "digest": cfg["digest"]})
    assert r.status_code == 200 and r.json() == {"data": None}
    res = next(x for x in a.data("/cluster/resources", params={"type": "vm"}) if x["vmid"] == 150)
    assert res["maxmem"] == 2048 << 20 and res["tags"] == "dev;new"
    r = a.req("PUT", "/nodes/pve1/qemu/150/config", data={"memory": "1024", "digest": cfg["digest"]})
    assert r.status_code == 500 and "detected modified configuration" in r.json()["message"]
    r = a.req("PUT", "/nodes/pve1/qemu/150/config", data={"no_such_option": "1"})
    assert r.status_code == 400
    wait_task(a, upid_of(a.req("DELETE", "/nodes/pve1/qemu/150")))
    assert a.get("/nodes/pve1/qemu/150/config").status_code == 500


def test_power_cycle_qemu(simw: SimHandle) -> None:
    a = api(simw)
    base = "/nodes/pve2/qemu/103"
    wait_task(a, upid_of(a.post(f"{base}/status/suspend")))
    assert a.data(f"{base}/status/current")["qmpstatus"] == "paused"
    r = a.post(f"{base}/status/shutdown")
    assert r.status_code == 500 and r.json()["message"] == "VM is paused - cannot shutdown\n"
    wait_task(a, upid_of(a.post(f"{base}/status/resume")))
    wait_task(a, upid_of(a.post(f"{base}/status/reboot")))
    wait_task(a, upid_of(a.post(f"{base}/status/shutdown")))
    assert a.data(f"{base}/status/current")["status"] == "stopped"
    r = a.post(f"{base}/status/suspend")
    assert r.status_code == 500 and r.json()["message"] == "VM 103 not running\n"
