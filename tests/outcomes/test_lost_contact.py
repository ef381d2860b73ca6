"""Proxmox accepted the task, then stopped answering the gateway's polls: the outcome is unknown,
so the call is recorded `interrupted` with its UPID (never `failed`), and the running gateway
settles it from Proxmox once Proxmox answers again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.outcomes.helpers import Gateway, call, env_for, posts, records, verify, wait_for


async def test_lost_contact_while_waiting_is_settled_by_the_running_gateway(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim)
    db = env.config.audit_path
    fsim.set_faults(task_seconds=1.0, error_rate=1.0, error_status=500, error_path=r"/tasks/.*/status$")
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        a = await call(env, env.token("lost-probe", ["operator"]), "vm_start", {"vmid": 102})
        assert a.status == 200 and a.outcome == "interrupted" and a.doc is not None, a.text[:400]
        upid = a.doc["result"]["structuredContent"]["task_id"]
        assert upid.startswith("UPID:pve2:") and "get_task_status" in a.doc["result"]["content"][0]["text"]
        kinds = [(r["kind"], r["outcome"]) for r in records(db, str(a.request_id))]
        assert kinds[-2:] == [("dispatch", "accepted"), ("result", "interrupted")], kinds
        fsim.set_faults(error_rate=0.0)  # Proxmox answers again
        got = await wait_for(
            lambda: [r for r in records(db, str(a.request_id)) if r["outcome"] == "reconciled"], 40, "reconciled"
        )
    finally:
        gw.stop()
    assert len(got) == 1 and got[0]["body"]["proxmox"] == "ok" and got[0]["body"]["task_id"] == upid
    assert len(posts(fsim, "/qemu/102/status/start")) == 1
    v = verify(env)
    assert v.returncode == 0, v.stderr
