"""A real full disk under the audit store (a small tmpfs filled with a ballast file, as root):
calls are refused with a clear JSON-RPC error before anything reaches Proxmox, the gateway
recovers by itself when space returns, and a disk that fills mid-call loses no outcome."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from gateway.store.outcomes import AUDIT_UNAVAILABLE
from tests.outcomes.helpers import (
    Answer,
    Gateway,
    call,
    env_for,
    fill,
    new_port,
    posts,
    process_state,
    records,
    request_ids,
    tmpfs,
    verify,
    wait_for,
)


def _refused(a: Answer) -> None:
    assert a.status == 503 and a.content_type.startswith("application/json"), (a.status, a.text[:300])
    assert a.doc is not None and a.doc["error"]["code"] == AUDIT_UNAVAILABLE, a.doc
    assert "audit store" in a.doc["error"]["message"] and "nothing was sent" in a.doc["error"]["message"]
    assert a.headers.get("retry-after")


async def test_full_disk_refuses_every_call_clearly_and_recovers(fsim: Any, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk") as disk:
        env = env_for(tmp_path, fsim, state_dir=disk / "state")
        gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
        try:
            token = env.token("disk-probe", ["operator"])
            assert (await call(env, token, "list_nodes", {})).outcome == "allowed"
            ballast = fill(disk)
            fsim.clear_logs()
            _refused(await call(env, token, "list_nodes", {}))
            _refused(await call(env, token, "vm_start", {"vmid": 102}))
            _refused(await call(env, token, "vm_stop", {"vmid": 103}))
            assert posts(fsim, "/status/start") == [] and posts(fsim, "/status/stop") == []  # nothing reached Proxmox
            ballast.unlink()  # space returns: no restart needed
            a = await call(env, token, "vm_start", {"vmid": 102})
            assert a.status == 200 and a.outcome == "allowed", a.doc
            assert [r["kind"] for r in records(env.config.audit_path, str(a.request_id))] == [
                "received",
                "decision",
                "dispatch",
                "result",
            ]
        finally:
            gw.stop()
        v = verify(env)
        assert v.returncode == 0, v.stderr


async def test_disk_filling_after_the_decision_refuses_the_call_and_closes_it(fsim: Any, tmp_path: Path) -> None:
    """The gateway commits a vm_start's decision and is frozen (test fault stop-after-decision); the
    disk fills meanwhile. Resumed, it refuses the call before anything is sent (503), and the call
    is closed by a `refusal` record kept until space returns, not by a look-up in Proxmox's task
    list (before, it was settled `reconciled`, `not_found`, from a search that could match another
    task of the same token on the same guest)."""
    with tmpfs(tmp_path / "disk") as disk:
        env = env_for(tmp_path, fsim, state_dir=disk / "state")
        db = env.config.audit_path
        gw = await Gateway(env, tmp_path / "serve.log", fault="stop-after-decision").start().wait_up()
        try:
            assert gw.proc is not None
            token = env.token("disk-probe", ["operator"])
            fsim.clear_logs()
            pending = asyncio.create_task(call(env, token, "vm_start", {"vmid": 102}))
            await wait_for(lambda: process_state(gw.proc.pid) == "T", 30, "the gateway to stop after the decision")
            (rid,) = request_ids(db, "vm_start")
            ballast = fill(disk)
            gw.signal(signal.SIGCONT)
            _refused(await pending)
            assert posts(fsim, "/status/start") == []  # nothing reached Proxmox
            assert [r["kind"] for r in records(db, rid)] == ["received", "decision"]  # the refusal is kept
            ballast.unlink()
            got = await wait_for(lambda: [r for r in records(db, rid) if r["kind"] == "refusal"], 10, "kept refusal")
            assert [(r["outcome"], r["body"]["sent"]) for r in got] == [("refused", False)], got
            assert "audit store" in got[0]["body"]["error"]
            await asyncio.sleep(12)  # a reconciliation pass (every 10 s) has run: nothing more for this call
            assert [r["kind"] for r in records(db, rid)] == ["received", "decision", "refusal"]
        finally:
            with contextlib.suppress(ProcessLookupError):
                gw.signal(signal.SIGCONT)
            gw.stop()
        v = verify(env)
        assert v.returncode == 0, v.stderr


async def test_disk_filling_mid_call_keeps_the_outcome(fsim: Any, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk") as disk:
        env = env_for(tmp_path, fsim, state_dir=disk / "state")
        db = env.config.audit_path
        fsim.set_faults(task_seconds=3.0)
        gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
        try:
            token = env.token("disk-probe", ["operator"])
            pending = asyncio.create_task(call(env, token, "vm_start", {"vmid": 102}))
            rid = (await wait_for(lambda: request_ids(db, "vm_start"), 20, "the decision"))[0]
            await wait_for(lambda: [r for r in records(db, rid) if r["kind"] == "dispatch"], 20, "dispatch")
            ballast = fill(disk)  # the task is still running in Proxmox
            _refused(await call(env, token, "list_nodes", {}))  # new calls: a clear refusal meanwhile
            a = await pending
            # the client learns what happened, and that its record is held until the store takes it
            assert a.status == 200 and a.content_type.startswith("application/json"), a.text[:300]
            assert a.outcome == "allowed" and a.request_id == rid, a.doc
            assert a.doc is not None and "kept" in a.doc["result"]["_meta"].get("pvegate/audit", ""), a.doc
            assert [r["kind"] for r in records(db, rid)] == ["received", "decision", "dispatch"]
            ballast.unlink()
            got = await wait_for(lambda: [r for r in records(db, rid) if r["kind"] == "result"], 10, "kept result")
            assert len(got) == 1 and got[0]["outcome"] == "ok"
            assert got[0]["body"]["task_id"] == records(db, rid)[2]["body"]["task_id"]
            b = await call(env, token, "list_nodes", {})  # and calls are taken again
            assert b.status == 200 and b.outcome == "allowed"
        finally:
            gw.stop()
        assert len(posts(fsim, "/qemu/102/status/start")) == 1
        v = verify(env)
        assert v.returncode == 0, v.stderr


async def test_disk_full_mid_call_then_sigkill_is_reconciled(fsim: Any, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk") as disk:
        env = env_for(tmp_path, fsim, state_dir=disk / "state")
        db = env.config.audit_path
        fsim.set_faults(task_seconds=2.0)
        gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
        try:
            token = env.token("disk-probe", ["operator"])
            pending = asyncio.create_task(call(env, token, "vm_start", {"vmid": 102}))
            rid = (await wait_for(lambda: request_ids(db, "vm_start"), 20, "the decision"))[0]
            await wait_for(lambda: [r for r in records(db, rid) if r["kind"] == "dispatch"], 20, "dispatch")
            ballast = fill(disk)
            a = await pending  # answered; its result is only in the gateway's memory
            assert a.outcome == "allowed"
            gw.kill()  # ... and gone with it
        finally:
            gw.kill()
        ballast.unlink()
        upid = records(db, rid)[2]["body"]["task_id"]
        assert [r["kind"] for r in records(db, rid)] == ["received", "decision", "dispatch"]
        env = new_port(env)
        gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
        try:
            got = await wait_for(lambda: [r for r in records(db, rid) if r["kind"] == "result"], 30, "reconciled")
        finally:
            gw.stop()
        assert len(got) == 1 and got[0]["outcome"] == "reconciled"
        assert got[0]["body"]["task_id"] == upid and got[0]["body"]["proxmox"] == "ok"
        v = verify(env)
        assert v.returncode == 0, v.stderr
