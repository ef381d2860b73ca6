"""A mutation whose answer never came (the gateway's read timeout): Proxmox may have run it, so
the call is recorded `interrupted` (never `failed`), and the running gateway finds the task in
Proxmox's task list and settles it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.core.config import load
from tests.outcomes.helpers import Gateway, call, env_for, posts, records, sim_tasks, verify, wait_for


async def test_a_lost_answer_is_settled_from_the_task_list(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim)
    raw = yaml.safe_load(env.config_path.read_text())
    raw["clusters"][0]["timeout"] = 1.0  # the gateway gives up on the answer after 1 s ...
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env.config = load(env.config_path)
    db = env.config.audit_path
    # ... while Proxmox starts the task at once and answers the POST 2.5 s later
    fsim.set_faults(answer_delay_ms=2500, answer_delay_path=r"/status/start$", task_seconds=0.5)
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        a = await call(env, env.token("lost-probe", ["operator"]), "vm_start", {"vmid": 102})
        assert a.status == 200 and a.outcome == "interrupted" and a.doc is not None, a.text[:400]
        assert "answer was lost" in a.doc["result"]["content"][0]["text"]
        rid = str(a.request_id)
        kinds = [(r["kind"], r["outcome"]) for r in records(db, rid)]
        assert kinds == [("received", None), ("decision", "allow"), ("result", "interrupted")], kinds
        task = await wait_for(
            lambda: [t for t in sim_tasks(fsim) if (t["type"], t["id"], t["status"]) == ("qmstart", "102", "stopped")],
            20,
            "the task Proxmox ran anyway",
        )
        fsim.set_faults(answer_delay_ms=0)
        got = await wait_for(lambda: [r for r in records(db, rid) if r["outcome"] == "reconciled"], 40, "reconciled")
    finally:
        gw.stop()
    assert len(got) == 1 and got[0]["body"]["found_by"] == "task_list"
    assert got[0]["body"]["task_id"] == task[0]["upid"] and got[0]["body"]["proxmox"] == "ok"
    assert len(posts(fsim, "/qemu/102/status/start")) == 1
    v = verify(env)
    assert v.returncode == 0, v.stderr
