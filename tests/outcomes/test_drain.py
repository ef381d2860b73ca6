"""SIGTERM with long tasks in flight: new calls get a 503 JSON answer at once, the calls in flight
are cut off after the configured grace period with a JSON answer naming their UPID, and their
outcome is settled later from Proxmox (`pvegate audit reconcile`)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.store.outcomes import SHUTTING_DOWN
from tests.outcomes.helpers import Gateway, call, ctx, env_for, posts, reconcile_cli, records, verify, wait_for


async def test_sigterm_past_the_grace_period_interrupts_then_reconciles(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim, shutdown_grace_seconds=2)
    db = env.config.audit_path
    fsim.set_faults(task_seconds=9.0)
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    token = env.token("drain-probe", ["operator"])
    try:
        calls = [
            asyncio.create_task(call(env, token, "vm_start", {"vmid": 102})),
            asyncio.create_task(call(env, token, "lxc_start", {"vmid": 202})),
        ]

        def dispatched() -> list[dict[str, Any]]:
            from tests.outcomes.helpers import rows

            return rows(db, "SELECT * FROM audit WHERE kind = 'dispatch'")

        await wait_for(lambda: len(dispatched()) == 2, 20, "two dispatch records")
        gw.signal(signal.SIGTERM)
        sent = time.monotonic()
        await asyncio.sleep(0.3)
        # at once: readiness red, and a new call is refused with a JSON body and Retry-After
        base = env.url.rsplit("/mcp", 1)[0]
        async with httpx.AsyncClient(verify=ctx(env), timeout=5) as http:
            health = await http.get(base + "/healthz")
        assert health.status_code == 503, health.text  # /healthz is readiness: red while draining
        late = await call(env, token, "list_nodes", {})
        assert late.status == 503 and late.content_type.startswith("application/json"), late
        assert late.headers.get("retry-after") and late.doc and late.doc["error"]["code"] == SHUTTING_DOWN
        answers = await asyncio.gather(*calls)
        took = time.monotonic() - sent
        assert gw.proc is not None
        gw.proc.wait(timeout=30)
    finally:
        gw.kill()
    assert 1.5 < took < 6, took  # the grace period (2 s), not the tasks' 9 s nor a fixed 5 s
    upids = {r["body"]["task_id"] for r in dispatched()}
    for a in answers:
        assert a.status == 200 and a.content_type.startswith("application/json"), a
        assert a.outcome == "interrupted" and a.doc is not None
        res = a.doc["result"]
        assert res["isError"] is True and res["structuredContent"]["task_id"] in upids
        assert "get_task_status" in res["content"][0]["text"]
        recs = records(db, str(a.request_id))
        assert [(r["kind"], r["outcome"]) for r in recs] == [
            ("received", None),
            ("decision", "allow"),
            ("dispatch", "accepted"),
            ("result", "interrupted"),
        ]
        assert recs[-1]["body"]["task_id"] == res["structuredContent"]["task_id"]
        assert recs[-1]["body"]["pending_reconcile"] is True

    # the tasks run on in Proxmox; once they are done, reconciliation settles both
    await asyncio.sleep(max(0.0, 9.5 - (time.monotonic() - sent)))
    done = reconcile_cli(env, "--min-age", "0s", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    for a in answers:
        recs = records(db, str(a.request_id))
        settled = [r for r in recs if r["outcome"] == "reconciled"]
        assert len(settled) == 1 and settled[0]["body"]["proxmox"] == "ok", recs
        assert settled[0]["body"]["task_id"] == recs[2]["body"]["task_id"]
    again = reconcile_cli(env, "--min-age", "0s", "--json")  # settled calls are not settled twice
    assert again.returncode == 0 and again.stdout.strip() == "[]", again.stdout
    assert len(posts(fsim, "/qemu/102/status/start")) == 1 and len(posts(fsim, "/lxc/202/status/start")) == 1
    state = fsim.state()["guests"]
    assert state["102"]["status"] == "running" and state["202"]["status"] == "running"
    v = verify(env)
    assert v.returncode == 0, v.stderr
