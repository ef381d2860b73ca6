"""The reconciler's background loop on a real audit file: a call on a cluster the configuration no
longer names is settled as `unverifiable` (with the reason), and a call that stays open (its
Proxmox does not answer) never holds up the settling of this process's own interrupted calls.
What the loop did is what health and metrics read (Reconciler.status)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.core.config import load
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.outcomes import Outcomes
from gateway.store.reconcile import Reconciler, open_calls
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.pve_api import PveApiClient
from tests.config.conftest import minimal, write

UPID = "UPID:pve1:000F6AAE:0A1B2C3D:65000000:qmstart:100:pvegate@pve!gw:"


def call(request_id: str, tool: str, effect: str, cluster: str, task_id: str | None = None) -> list[AuditRecord]:
    """An allowed call's records as the pipeline writes them, with no settling result."""
    target = {"cluster": cluster, "node": "pve1", "vmid": 100, "kind": "qemu"}
    key = f"{cluster}/qemu/100"
    recs = [
        AuditRecord(request_id, "received", "agent", tool, key, None, {"target": target, "effect": effect}),
        AuditRecord(request_id, "decision", "agent", tool, key, "allow", {"allow": True}),
    ]
    if task_id is not None:
        recs.append(AuditRecord(request_id, "dispatch", "agent", tool, key, "accepted", {"task_id": task_id}))
    return recs


async def until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def results(path: Path, request_id: str) -> list[dict[str, Any]]:
    import sqlite3

    con = sqlite3.connect(path)
    try:
        rows = con.execute(
            "SELECT outcome, body FROM audit WHERE request_id = ? AND kind = 'result' ORDER BY seq", (request_id,)
        ).fetchall()
    finally:
        con.close()
    return [{"outcome": o, **json.loads(b)} for o, b in rows]


async def test_an_unknown_cluster_is_settled_and_an_open_call_never_blocks_the_own_calls(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, minimal(tmp_path)))  # one cluster, `default`, where nothing answers (port 9)
    catalog = Catalog.load(cfg.connectors_dir)
    path = tmp_path / "audit.db"
    log = AuditLog(path)
    await log.open()
    clients = {name: PveApiClient(cl) for name, cl in cfg.clusters.items()}
    reconciler: Reconciler | None = None
    try:
        # an earlier run: a vm_start on a cluster since removed from the configuration, and one on
        # `default` whose Proxmox cannot be asked (stays open)
        await log.append(*call("retired-1", "vm_start", "write", "retired", UPID))
        await log.append(*call("down-1", "vm_start", "write", "default", UPID.replace("0A1B", "0B1B")))
        before = time.time()
        await asyncio.sleep(0.01)
        # this process: a read cut off mid-way (Outcomes.unsettled), for the periodic pass to settle
        await log.append(*call("own-1", "vm_agent_network", "read", "default"))
        outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
        outcomes.unsettled.add("own-1")
        reconciler = Reconciler(cfg, catalog, outcomes, clients)
        task = reconciler.start(before, interval=0.2)

        await until(lambda: "own-1" not in outcomes.unsettled)
        # the own call is settled although an earlier run's call is still open
        assert [r["outcome"] for r in results(path, "own-1")] == ["interrupted"]
        assert [c.request_id for c in open_calls(path, 0, time.time() + 1)] == ["down-1"]
        retired = results(path, "retired-1")
        assert len(retired) == 1 and retired[0]["outcome"] == "reconciled", retired
        assert retired[0]["proxmox"] == "unverifiable" and retired[0]["task_id"] == UPID
        assert "cluster retired is not in this configuration" in retired[0]["reason"]
        assert outcomes.counters.reconciled == 1

        await until(lambda: reconciler is not None and reconciler.earlier_open == 1)
        status = reconciler.status()
        assert status["task_alive"] and status["task_error"] is None and status["last_error"] is None
        assert status["open_calls"] == 1 and status["open"]["earlier_runs"] == 1
        assert status["open"]["own_interrupted"] == 0 and not status["earlier_runs_settled"]
        assert status["last_pass_at"] is not None and status["last_pass_age_seconds"] < 5
        first = status["last_pass_at"]
        await until(lambda: (reconciler.last_pass_at or 0) > first)  # it goes on: the heartbeat moves
        assert not task.done()
    finally:
        if reconciler is not None and reconciler.task is not None:
            reconciler.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciler.task
        for client in clients.values():
            await client.close()
        await log.close()
    assert reconciler.task_error() == "the reconciler task was cancelled"


async def test_a_pass_that_keeps_failing_is_never_hidden_by_another_that_succeeds(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The pass over earlier runs failing at every try (the fault injected into our own code: nothing
    else makes it fail on a healthy file) while the periodic pass, with nothing to do, succeeds: the
    error stays shown, the heartbeat does not move, and the open count is unknown, not zero."""
    cfg = load(write(tmp_path, minimal(tmp_path)))
    path = tmp_path / "audit.db"
    log = AuditLog(path)
    await log.open()
    outcomes = Outcomes(log, grace_seconds=1, min_free_bytes=0)
    reconciler = Reconciler(cfg, Catalog.load(cfg.connectors_dir), outcomes, {})

    async def broken(*args: Any, **kwargs: Any) -> list[Any]:
        raise RuntimeError("injected")

    monkeypatch.setattr(reconciler, "run_once", broken)
    try:
        reconciler.start(time.time(), interval=0.05)
        await asyncio.sleep(1.0)  # many periodic rounds, and the failing pass more than once
        status = reconciler.status()
        assert status["last_error"] and "reconciliation pass failed: RuntimeError" in status["last_error"], status
        assert status["last_pass_at"] is None and status["open_calls"] is None, status
    finally:
        assert reconciler.task is not None
        reconciler.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reconciler.task
        await log.close()
