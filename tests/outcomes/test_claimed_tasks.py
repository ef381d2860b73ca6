"""A call of this run whose answer was lost (HTTP 596: the API node lost the target node after forwarding;
here nothing was started) is settled by the running gateway's pass over its own calls. A task of the same
type on the same guest that the previous run started, and recorded with its UPID, a moment before this run
began is another call's: it is claimed whatever pass reads the claims, so this call is `not_found`, never
`ok` with the previous run's UPID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.outcomes.helpers import Gateway, call, env_for, new_port, posts, records, request_ids, verify, wait_for


async def test_a_task_the_previous_run_recorded_is_never_taken_for_this_runs_call(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim, generous_quotas=True)
    db = env.config.audit_path
    token = env.token("claim-probe", ["operator"])
    gw = await Gateway(env, tmp_path / "serve1.log").start().wait_up()
    try:
        first = await call(env, token, "vm_start", {"vmid": 102})
        assert first.status == 200 and first.outcome == "allowed", first.text[:400]
        stopped = await call(env, token, "vm_stop", {"vmid": 102})
        assert stopped.status == 200 and stopped.outcome == "allowed", stopped.text[:400]
    finally:
        gw.stop()
    (run1,) = request_ids(db, "vm_start")
    run1_upid = next(r["body"]["task_id"] for r in records(db, run1) if r["kind"] == "dispatch")
    assert ":qmstart:102:" in run1_upid

    env = new_port(env)
    gw = await Gateway(env, tmp_path / "serve2.log").start().wait_up()
    try:
        # the API node answers 596 before the start reaches the target node: nothing is started
        fsim.set_faults(error_rate=1.0, error_status=596, error_path=r"/qemu/102/status/start$")
        lost = await call(env, token, "vm_start", {"vmid": 102})
        fsim.set_faults(error_rate=0.0, error_path=None)
        assert lost.status == 200 and lost.outcome == "interrupted", lost.text[:400]
        rid = str(lost.request_id)
        assert rid != run1
        got = await wait_for(
            lambda: [r for r in records(db, rid) if r["kind"] == "result" and r["outcome"] == "reconciled"],
            40,
            "the reconciled result of this run's call",
        )
    finally:
        gw.stop()
    assert len(got) == 1, got
    body = got[0]["body"]
    assert body["proxmox"] == "not_found" and body["task_id"] is None, body
    assert run1_upid not in str([r["body"] for r in records(db, rid)])
    # the witness: one qmstart ran (run 1's), the guest is stopped (run 1's stop), run 1's call keeps its UPID
    assert fsim.state()["guests"]["102"]["status"] == "stopped"
    starts = [r for r in records(db, run1) if r["kind"] == "result"]
    assert [(r["outcome"], r["body"]["task_id"]) for r in starts] == [("ok", run1_upid)]
    assert len(posts(fsim, "/qemu/102/status/start")) >= 1
    v = verify(env)
    assert v.returncode == 0, v.stderr
