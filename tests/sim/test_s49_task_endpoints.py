"""The task endpoints answer as PVE/API2/Tasks.pm and pve-common's dump_logfile do.

What was wrong: the simulator answered a task status for an unknown UPID (one rotated out of the
history, or another node's) with HTTP 500 "no such task '<upid>'", and an unparseable UPID with 500 too;
Proxmox raises a parameter exception there: HTTP 400 "Parameter verification failed." with
`errors: {upid: "no such task"}` (or "unable to parse worker upid"). The task log of an unknown task was a
500 as well, while Proxmox answers 200 with one line "unable to open file - ..." (read_task_log checks
only that the UPID parses), an empty log one line "no content", and `limit=0` reads to the end. Rows of
running tasks in the node task list (source=active/all) carry `status: "RUNNING"`, which the simulator
left out. Why it matters: the gateway's reconciler and its task tools are tested only against the
simulator, so every way Proxmox answers them must be the one they meet here, or a gateway that reads
"no such task" (or a task row's status) wrongly passes its tests and fails on a real cluster.
"""

from __future__ import annotations

from typing import Any

from gateway.sim.harness import SimHandle

from .conftest import api
from .test_tasks import upid_of, wait_task

MISSING = "UPID:pve1:000FFFFF:0000ABCD:60000000:qmstart:101:root@pam!pvegate:"


def _param_error(r: Any, why: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    assert body["data"] is None and body["errors"] == {"upid": why}, body
    assert body["message"] == "Parameter verification failed.\n"


def test_unknown_task_status_is_a_parameter_error(simw: SimHandle) -> None:
    a = api(simw)
    _param_error(a.get(f"/nodes/pve1/tasks/{MISSING}/status"), "no such task")
    _param_error(a.get("/nodes/pve1/tasks/UPID:nonsense/status"), "unable to parse worker upid")
    # a real task asked of another node: that node has no such task file
    upid = upid_of(a.post("/nodes/pve2/qemu/102/status/start"))
    wait_task(a, upid)
    _param_error(a.get(f"/nodes/pve1/tasks/{upid}/status"), "no such task")


def test_unknown_task_log_is_one_line(simw: SimHandle) -> None:
    a = api(simw)
    r = a.get(f"/nodes/pve1/tasks/{MISSING}/log")
    assert r.status_code == 200, r.text
    assert r.json() == {"data": [{"n": 1, "t": "unable to open file - No such file or directory"}], "total": 1}
    _param_error(a.get("/nodes/pve1/tasks/UPID:nonsense/log"), "unable to parse worker upid")


def test_log_limit_zero_reads_to_the_end(simw: SimHandle) -> None:
    a = api(simw)
    upid = upid_of(a.post("/nodes/pve2/qemu/102/status/stop"))
    wait_task(a, upid)
    whole = a.get(f"/nodes/pve2/tasks/{upid}/log").json()
    assert whole["total"] >= 1 and whole["data"][-1]["t"] == "TASK OK"
    assert a.get(f"/nodes/pve2/tasks/{upid}/log", params={"limit": 0}).json() == whole


def test_running_task_rows_say_running(simw: SimHandle) -> None:
    a = api(simw)
    upid = upid_of(a.post("/nodes/pve2/qemu/102/status/start"))
    for source in ("active", "all"):
        rows = {t["upid"]: t for t in a.data("/nodes/pve2/tasks", params={"source": source})}
        assert rows[upid]["status"] == "RUNNING" and "endtime" not in rows[upid], rows[upid]
    assert a.data(f"/nodes/pve2/tasks/{upid}/status")["status"] == "running"
    assert wait_task(a, upid)["exitstatus"] == "OK"


def test_statusfilter_unknown_is_the_running_tasks(simw: SimHandle) -> None:
    """upid_normalize_status_type: a running task has no status at filter time: `unknown` (there is no
    `active` class; the simulator used one, so statusfilter=unknown never found a running task)."""
    a = api(simw)
    upid = upid_of(a.post("/nodes/pve2/qemu/102/status/stop"))
    rows = a.data("/nodes/pve2/tasks", params={"source": "active", "statusfilter": "unknown"})
    assert upid in [t["upid"] for t in rows]
    ok = a.data("/nodes/pve2/tasks", params={"source": "active", "statusfilter": "ok"})
    assert upid not in [t["upid"] for t in ok]
    assert wait_task(a, upid)["exitstatus"] == "OK"
