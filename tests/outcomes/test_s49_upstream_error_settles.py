"""An allowed call that ends `upstream_error` (Proxmox could not be asked: unreachable, TLS, its 401 for the
gateway's token, an open circuit) has a known outcome: nothing was sent, nothing to look up (docs/audit.md).
The settling condition (store/settling.py) did not count that result, so the call stayed open in the audit:
the running gateway never settled it, an archive could not cut past it, and the next start (or `pvegate audit
reconcile`) looked it up in Proxmox's task list, where a task the same token started outside the gateway on
the same guest was recorded as this call's (`reconciled`, `proxmox: ok`): an action the gateway never sent
written down as one it ran."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.store.reconcile import open_calls
from tests.outcomes.helpers import Gateway, call, env_for, reconcile_cli, records, sim_tasks, wait_for


async def _start_outside(sim: Any) -> str:
    """VM 102 started with the gateway's own token by something else (a script holding the token)."""
    r = httpx.post(
        sim.api_url.rstrip("/") + "/nodes/pve2/qemu/102/status/start",
        headers={"Authorization": "PVEAPIToken=" + sim.tokens["admin"]},
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
    )
    assert r.status_code == 200, r.text[:300]
    upid = str(r.json()["data"])
    await wait_for(lambda: [t for t in sim_tasks(sim) if t["upid"] == upid and t["status"] == "stopped"], 20, "task")
    return upid


async def test_an_upstream_error_settles_the_call_and_is_never_matched_to_a_task(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim)
    db = env.config.audit_path
    fsim.set_faults(task_seconds=0.1, error_rate=1.0, error_status=401, error_path=r"/qemu/102/status/start$")
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        a = await call(env, env.token("upstream-probe", ["operator"]), "vm_start", {"vmid": 102})
        assert a.status == 200 and a.outcome == "failed", a.text[:400]
        rid = str(a.request_id)
        kinds = [(r["kind"], r["outcome"]) for r in records(db, rid)]
        assert kinds[-2:] == [("decision", "allow"), ("result", "upstream_error")], kinds
        assert rid not in {c.request_id for c in open_calls(db, None, None)}  # settled by its result
    finally:
        gw.stop()
    fsim.set_faults(error_rate=0.0)
    time.sleep(0.05)
    outside = await _start_outside(fsim)  # the same token, the same guest, within the call's window
    done = reconcile_cli(env, "--min-age", "0s", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    after = [(r["kind"], r["outcome"], r["body"].get("task_id")) for r in records(db, rid)]
    assert after[-1][:2] == ("result", "upstream_error"), (after, outside)
    assert not [r for r in after if r[1] == "reconciled"], after
