"""A task that outlives the gateway's wait (its tool's task_timeout) has no known outcome yet: the
call's result is `running` (pending_reconcile), not `ok`, and the running gateway records how it
ended from Proxmox. It was `ok` for good, however the task ended (a clone, a restore or a resize
that failed later was audited as a success)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.outcomes.helpers import Gateway, call, env_for, records, verify, wait_for

REPO = Path(__file__).resolve().parents[2]


async def test_a_task_still_running_is_left_to_reconciliation(fsim: Any, tmp_path: Path) -> None:
    connectors = tmp_path / "connectors"
    shutil.copytree(REPO / "connectors", connectors)
    power = connectors / "power.yaml"
    text = power.read_text()
    start = text.index("  - name: vm_start\n")
    cut = text.index("task_timeout: 120", start)
    power.write_text(text[:cut] + "task_timeout: 1" + text[cut + len("task_timeout: 120") :])
    env = env_for(tmp_path, fsim, connectors_dir=str(connectors))
    db = env.config.audit_path
    fsim.set_faults(task_seconds=4.0)  # the task takes longer than the wait
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        a = await call(env, env.token("slow-task-probe", ["operator"]), "vm_start", {"vmid": 102})
        assert a.status == 200 and a.outcome == "allowed", a.text[:400]
        assert "task still running" in a.text
        results = [r for r in records(db, str(a.request_id)) if r["kind"] == "result"]
        assert [r["outcome"] for r in results] == ["running"], results
        assert results[0]["body"]["pending_reconcile"] is True and results[0]["body"]["task_id"].startswith("UPID:")
        got = await wait_for(
            lambda: [r for r in records(db, str(a.request_id)) if r["outcome"] == "reconciled"], 40, "reconciled"
        )
    finally:
        gw.stop()
        fsim.set_faults(task_seconds=None)
    assert len(got) == 1 and got[0]["body"]["proxmox"] == "ok", got
    assert got[0]["body"]["task_id"] == results[0]["body"]["task_id"]
    v = verify(env)
    assert v.returncode == 0, v.stderr
