"""Mixed load (reads and mutations, several principals) through a disk that fills and frees, a
SIGKILL and restart, and a SIGTERM with long tasks in flight. Afterwards every task the simulator
ran has exactly one settling record (result ok/failed or reconciled) naming its UPID, no allowed
call is left open, no client got an HTTP 5xx without a JSON body, and the chain verifies.
Bounded: about twenty seconds of load phases plus start-ups. It once stayed unready for 60 s after
the SIGKILL restart: readiness used its own 16 MiB free-space floor while calls used
audit.min_free_mb (1 MiB here), so on this small tmpfs the gateway served calls but never reported
ready. Both now use audit.min_free_mb. It also once found no mutation in flight before the
SIGTERM: on a quiet machine the load spent the example policy's ten writes a tool a minute per
agent within seconds, and every later mutation was denied by quota; the policy here has rate
limits the load cannot reach (the test is about outcomes, not quotas)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.store.reconcile import open_calls
from tests.outcomes.helpers import Gateway, call, env_for, fill, new_port, rows, sim_tasks, tmpfs, verify, wait_for

MUTATIONS = [
    ("vm_start", {"vmid": 102}),
    ("vm_stop", {"vmid": 102}),
    ("vm_start", {"vmid": 103}),
    ("vm_stop", {"vmid": 103}),
    ("lxc_start", {"vmid": 202}),
    ("lxc_stop", {"vmid": 202}),
]
READS = [("list_nodes", {}), ("list_guests", {})]


@dataclass
class Tally:
    statuses: dict[int, int] = field(default_factory=dict)
    bare_5xx: list[str] = field(default_factory=list)  # 5xx answers without a JSON body
    transport_errors: int = 0

    def add(self, status: int, content_type: str, text: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status >= 500 and not content_type.startswith("application/json"):
            self.bare_5xx.append(f"{status} {content_type} {text[:120]}")


async def _worker(
    live: dict[str, Any], token: str, plan: list[tuple[str, dict[str, Any]]], stop: asyncio.Event, t: Tally
) -> None:
    for tool, args in itertools.cycle(plan):
        if stop.is_set():
            return
        try:
            a = await call(live["env"], token, tool, args, timeout=30)  # the gateway of the moment
            t.add(a.status, a.content_type, a.text)
        except (httpx.HTTPError, OSError):
            t.transport_errors += 1  # the gateway is down (killed, restarting): no HTTP answer at all
            await asyncio.sleep(0.2)


async def test_mixed_load_through_a_full_disk_a_sigkill_and_a_sigterm(fsim: Any, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk") as disk:
        env = env_for(tmp_path, fsim, state_dir=disk / "state", generous_quotas=True, shutdown_grace_seconds=2)
        db = env.config.audit_path
        fsim.set_faults(task_seconds=0.4)
        log = tmp_path / "serve.log"
        gw = await Gateway(env, log).start().wait_up()
        tally, stop, live = Tally(), asyncio.Event(), {"env": env}

        def in_flight() -> bool:
            return bool(open_calls(db, 0, time.time()))

        principals = {
            "mix-a": (["operator"], MUTATIONS[:2] + READS),
            "mix-b": (["operator"], MUTATIONS[2:4] + READS),
            "mix-c": (["operator"], MUTATIONS[4:] + READS),
            "mix-r": (["viewer"], READS),
        }
        workers = [
            asyncio.create_task(_worker(live, env.token(sub, roles), plan, stop, tally))
            for sub, (roles, plan) in principals.items()
            for _ in range(2)
        ]
        try:
            await asyncio.sleep(4)
            ballast = fill(disk)  # the store fills under load ...
            await asyncio.sleep(2)
            ballast.unlink()  # ... and frees: the same process carries on
            await asyncio.sleep(3)
            # kill and drain only with a mutation dispatched and unsettled: on a loaded machine a
            # fixed sleep once let the SIGKILL land between mutations, and there was nothing to settle
            await wait_for(in_flight, 20, "a mutation in flight before the SIGKILL")
            gw.kill()  # SIGKILL mid-load
            env = new_port(env)
            gw = await Gateway(env, log).start().wait_up()
            live["env"] = env
            await asyncio.sleep(3)
            fsim.set_faults(task_seconds=6.0)  # long tasks, then SIGTERM past the 2 s grace period
            await asyncio.sleep(1.5)
            await wait_for(in_flight, 20, "a mutation in flight before the SIGTERM")
            gw.signal(signal.SIGTERM)
            assert gw.proc is not None
            await asyncio.to_thread(gw.proc.wait, 30)
            gw.reap()
        finally:
            stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*workers, return_exceptions=True), 40)
            gw.kill()
        fsim.set_faults(task_seconds=0.4)
        await wait_for(lambda: all(t["status"] == "stopped" for t in sim_tasks(fsim)), 20, "Proxmox tasks to end")
        env = new_port(env)
        gw = await Gateway(env, log).start().wait_up()  # settles what the kill and the drain left open
        try:
            await wait_for(lambda: not open_calls(db, 0, time.time()), 60, "reconciliation of every open call")
        finally:
            gw.stop()

        assert not tally.bare_5xx, tally.bare_5xx
        tasks = sim_tasks(fsim)
        settling = rows(
            db,
            "SELECT request_id, outcome, body FROM audit WHERE kind = 'result' "
            "AND outcome IN ('ok', 'failed', 'reconciled') AND json_extract(body, '$.task_id') IS NOT NULL",
        )
        by_upid: dict[str, list[str]] = {}
        for r in settling:
            by_upid.setdefault(r["body"]["task_id"], []).append(f"{r['outcome']}:{r['request_id']}")
        missing = [t["upid"] for t in tasks if t["upid"] not in by_upid]
        doubled = {u: v for u, v in by_upid.items() if len(v) > 1}
        assert not missing and not doubled, (missing, doubled)
        assert set(by_upid) == {t["upid"] for t in tasks}  # and no record names a task Proxmox never ran
        outcomes = {
            r["outcome"]: r["n"]
            for r in rows(db, "SELECT outcome, COUNT(*) AS n FROM audit WHERE kind='result' GROUP BY 1")
        }
        assert outcomes.get("reconciled", 0) >= 1, outcomes  # the kill and the drain left something to settle
        assert tally.statuses.get(503, 0) >= 1, tally.statuses  # the full disk and the drain were refused clearly
        v = verify(env)
        assert v.returncode == 0, v.stderr
        print(
            f"chaos: {len(tasks)} Proxmox tasks, results {outcomes}, HTTP {tally.statuses}, "
            f"{tally.transport_errors} transport errors"
        )
