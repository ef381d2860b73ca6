"""SIGKILL at the two worst moments of a mutation: while the gateway waits on the Proxmox task,
and between Proxmox's answer and the dispatch record. The restarted gateway settles both from
what Proxmox says, linked to the original request id; the simulator's task list is the witness."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.outcomes.helpers import (
    Gateway,
    call,
    env_for,
    new_port,
    posts,
    records,
    request_ids,
    sim_tasks,
    task_stopped,
    verify,
    wait_for,
)


def _kinds(recs: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(r["kind"], r["outcome"]) for r in recs]


async def test_sigkill_while_waiting_on_a_task_is_reconciled_by_its_upid(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim)
    db = env.config.audit_path
    fsim.set_faults(task_seconds=3.0)
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        token = env.token("kill-probe", ["operator"])
        pending = asyncio.create_task(call(env, token, "vm_start", {"vmid": 102}))
        # the dispatch record (with the UPID) is on disk while the gateway still waits on the task
        rid = (await wait_for(lambda: request_ids(db, "vm_start"), 20, "the decision"))[0]
        dispatch = await wait_for(
            lambda: [r for r in records(db, rid) if r["kind"] == "dispatch"], 20, "the dispatch record"
        )
        assert not pending.done()
        gw.kill()
        try:
            await pending
            raise AssertionError("the call answered although the gateway was killed")
        except Exception:  # the killed gateway's client sees a transport error
            pass
    finally:
        gw.kill()
    upid = dispatch[0]["body"]["task_id"]
    assert dispatch[0]["outcome"] == "accepted" and upid.startswith("UPID:pve2:") and ":qmstart:102:" in upid
    assert _kinds(records(db, rid)) == [("received", None), ("decision", "allow"), ("dispatch", "accepted")]
    await task_stopped(fsim, upid)

    env = new_port(env)
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        got = await wait_for(
            lambda: [r for r in records(db, rid) if r["kind"] == "result"], 30, "the reconciled result"
        )
    finally:
        gw.stop()
    assert len(got) == 1 and got[0]["outcome"] == "reconciled", got
    assert got[0]["body"]["proxmox"] == "ok" and got[0]["body"]["task_id"] == upid
    assert got[0]["body"]["found_by"] == "upid" and got[0]["body"]["exitstatus"] == "OK"
    assert got[0]["principal"] == "kill-probe" and got[0]["tool"] == "vm_start"
    assert len(posts(fsim, "/qemu/102/status/start")) == 1  # Proxmox heard of it once
    assert fsim.state()["guests"]["102"]["status"] == "running"
    v = verify(env)
    assert v.returncode == 0, v.stderr


async def test_sigkill_between_the_answer_and_the_dispatch_record_is_found_in_the_task_list(
    fsim: Any, tmp_path: Path
) -> None:
    env = env_for(tmp_path, fsim)
    db = env.config.audit_path
    gw = await Gateway(env, tmp_path / "serve.log", fault="kill-after-dispatch-response").start().wait_up()
    try:
        token = env.token("kill-probe", ["operator"])
        try:
            await call(env, token, "vm_start", {"vmid": 102})
            raise AssertionError("the gateway answered; the fault hook did not fire")
        except Exception:
            pass
        assert gw.proc is not None and gw.proc.wait(timeout=30) == -9
    finally:
        gw.kill()
    rid = request_ids(db, "vm_start")[0]
    assert _kinds(records(db, rid)) == [("received", None), ("decision", "allow")]  # no UPID on disk
    started = posts(fsim, "/qemu/102/status/start")
    assert len(started) == 1  # ... but Proxmox accepted it
    task = await wait_for(
        lambda: [t for t in sim_tasks(fsim) if (t["type"], t["id"], t["status"]) == ("qmstart", "102", "stopped")],
        20,
        "the qmstart task",
    )

    env = new_port(env)
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        got = await wait_for(
            lambda: [r for r in records(db, rid) if r["kind"] == "result"], 30, "the reconciled result"
        )
    finally:
        gw.stop()
    assert len(got) == 1 and got[0]["outcome"] == "reconciled", got
    body = got[0]["body"]
    assert body["found_by"] == "task_list" and body["task_id"] == task[0]["upid"] and body["proxmox"] == "ok"
    searches = [r for r in fsim.requests_log() if r["method"] == "GET" and r["path"].endswith("/nodes/pve2/tasks")]
    assert searches, "reconciliation did not search the node's task list"
    v = verify(env)
    assert v.returncode == 0, v.stderr
