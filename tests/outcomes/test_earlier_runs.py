"""Which calls the pass over earlier runs settles, whatever the clocks did: every call open when the
gateway starts (read before it serves, Reconciler.read_earlier), also one stamped after the start (the
clock stepped back between the crash and the restart); a call decided before the 7-day look-back is
settled once, `unverifiable` unless Proxmox still answers for its UPID, never dropped silently; a call
searched on every node is left open, never `not_found`, while a node cannot be searched. Crashed runs'
audits written here, their clocks shifted while they write; the simulator is the witness."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import ssl
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.sim.scenario import scenario_path
from gateway.store import audit as auditlib
from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.outcomes import Outcomes
from gateway.store.reconcile import LOOKBACK_SECONDS, Reconciler
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.pve_api import PveApiClient
from tests.outcomes.helpers import Gateway, env_for, reconcile_cli, records, task_stopped, verify, wait_for

GUEST = {"cluster": "default", "node": "pve2", "type": "qemu", "vmid": 102}
GUEST_KEY = "default/qemu/102"
GONE_UPID = "UPID:pve2:000F6AAE:0A1B2C3D:65000000:qmstop:102:root@pam!pvegate:"  # a task Proxmox does not know


def _call(
    rid: str, tool: str, *, effect: str = "write", task_id: str | None = None, target: dict[str, Any] | None = None
) -> list[AuditRecord]:
    """received + decision (allow) of a call whose gateway died before it ended (+ dispatch with a UPID); on
    VM 102 unless `target` says otherwise."""
    key = GUEST_KEY if target is None else str(target["cluster"])
    target = GUEST if target is None else target
    recs = [
        AuditRecord(rid, "received", "crash-probe", tool, key, None, {"target": target, "effect": effect}),
        AuditRecord(rid, "decision", "crash-probe", tool, key, "allow", {"allow": True}),
    ]
    if task_id is not None:
        recs.append(AuditRecord(rid, "dispatch", "crash-probe", tool, key, "accepted", {"task_id": task_id}))
    return recs


@contextlib.contextmanager
def _clock(shift: float) -> Iterator[None]:
    """The audit writer's clock `shift` seconds off (only the audit module's view of it)."""
    real = time.time
    fake = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fake.time = lambda: real() + shift
    with pytest.MonkeyPatch.context() as m:
        m.setattr(auditlib, "time", fake)
        yield


async def _crashed_run(env: Any, shift: float, *calls: list[AuditRecord]) -> None:
    """What a crashed run left in the audit, written with its clock `shift` seconds off."""
    cfg = env.config
    log = AuditLog(cfg.audit_path, head_key=cfg.audit_key_path)
    await log.open()
    try:
        with _clock(shift):
            for recs in calls:
                await log.append(*recs)
    finally:
        await log.close()


async def _post(sim: Any, method: str, path: str) -> str:
    """A request sent with the gateway's own token (as the crashed gateway sent it): the finished task's UPID."""
    r = httpx.request(
        method,
        sim.api_url.rstrip("/") + path,
        headers={"Authorization": "PVEAPIToken=" + sim.tokens["admin"]},
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
    )
    assert r.status_code == 200, r.text[:300]
    upid = str(r.json()["data"])
    await task_stopped(sim, upid)
    return upid


def _results(env: Any, rid: str) -> list[dict[str, Any]]:
    return [r for r in records(env.config.audit_path, rid) if r["kind"] == "result"]


async def _settled(env: Any, *rids: str, timeout: float = 40) -> dict[str, dict[str, Any]]:
    """Each call's one result, once all have theirs."""
    await wait_for(lambda: all(_results(env, rid) for rid in rids), timeout, f"results for {rids}")
    out = {}
    for rid in rids:
        (res,) = _results(env, rid)
        out[rid] = {"outcome": res["outcome"], **res["body"]}
    return out


async def test_a_call_stamped_after_the_restart_is_settled(fsim: Any, tmp_path: Path) -> None:
    """The crashed run's clock was an hour ahead (or the host's clock was stepped back before the restart):
    its open vm_start (no UPID recorded) is stamped after the restarted gateway's start. It is an earlier
    run's all the same, and the restarted gateway settles it (no task in Proxmox's list: not_found)."""
    env = env_for(tmp_path, fsim)
    await _crashed_run(env, 3600, _call("ahead-1", "vm_start"))
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        got = await _settled(env, "ahead-1")
    finally:
        gw.stop()
    body = got["ahead-1"]
    assert body["outcome"] == "reconciled" and body["proxmox"] == "not_found", body
    assert body["decided_at"] > time.time() + 3000, body  # stamped after the start indeed
    v = verify(env)
    assert v.returncode == 0, v.stderr


async def test_a_restart_whose_clock_is_behind_finds_the_crashed_calls_task(fsim: Any, tmp_path: Path) -> None:
    """The same from the other side: the restarted process's clock is an hour behind the crashed run's.
    The crashed run's vm_start reached Proxmox (a qmstart of the gateway's token), its UPID was never
    recorded; the task list, searched around the decision, not cut at this run's start (the two times
    are not comparable), finds it."""
    env = env_for(tmp_path, fsim)
    cfg = env.config
    fsim.set_faults(task_seconds=0.1)
    await _crashed_run(env, 0, _call("behind-1", "vm_start"))
    upid = await _post(fsim, "POST", "/nodes/pve2/qemu/102/status/start")
    before = time.time() - 3600  # this run's start, by its clock
    catalog = Catalog.load(cfg.connectors_dir)
    log = AuditLog(cfg.audit_path, head_key=cfg.audit_key_path)
    await log.open()
    clients = {name: PveApiClient(cl) for name, cl in cfg.clusters.items()}
    reconciler = Reconciler(cfg, catalog, Outcomes(log, grace_seconds=1, min_free_bytes=0), clients)
    try:
        # the window of a call stamped after this run's start is not empty, and holds its decision time
        decided = before + 3600
        since, until = reconciler.task_window("default", decided, before)
        assert since <= decided - 60 and until >= decided + 60, (since, until)
        await reconciler.read_earlier(before)
        reconciler.start(before, interval=0.2)
        got = await _settled(env, "behind-1", timeout=20)
    finally:
        if reconciler.task is not None:
            reconciler.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reconciler.task
        for client in clients.values():
            await client.close()
        await log.close()
    body = got["behind-1"]
    assert body["proxmox"] == "ok" and body["task_id"] == upid and body["found_by"] == "task_list", body


async def test_calls_decided_before_the_look_back_are_settled_once_never_dropped(fsim: Any, tmp_path: Path) -> None:
    """Calls a crashed run decided eight days ago (past Proxmox's task history): one without a UPID is
    settled `unverifiable` with the reason (a search would find nothing and say `not_found`); one whose
    UPID Proxmox still answers for is settled from it; one whose UPID Proxmox no longer knows is
    `unverifiable` too; a read is settled as a read. Nothing is left open, and the log says so."""
    env = env_for(tmp_path, fsim)
    fsim.set_faults(task_seconds=0.1)
    upid = await _post(fsim, "POST", "/nodes/pve2/qemu/102/status/start")
    eight_days = -(LOOKBACK_SECONDS + 86400)
    await _crashed_run(
        env,
        eight_days,
        _call("old-none", "vm_start"),
        _call("old-known", "vm_start", task_id=upid),
        _call("old-gone", "vm_stop", task_id=GONE_UPID),
        _call("old-read", "vm_agent_network", effect="read"),
    )
    await _crashed_run(env, 0, _call("recent-1", "vm_stop"))  # inside the look-back: searched as ever
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        got = await _settled(env, "old-none", "old-known", "old-gone", "old-read", "recent-1")
    finally:
        gw.stop()
    for rid in ("old-none", "old-gone"):
        body = got[rid]
        assert body["outcome"] == "reconciled" and body["proxmox"] == "unverifiable", body
        assert body["past_lookback"] is True and "7-day look-back" in body["reason"], body
        assert body["decided_at"] < time.time() - LOOKBACK_SECONDS, body
    assert got["old-gone"]["task_id"] == GONE_UPID and got["old-none"]["task_id"] is None
    known = got["old-known"]
    assert known["proxmox"] == "ok" and known["task_id"] == upid and known["found_by"] == "upid", known
    assert got["old-read"]["outcome"] == "interrupted" and got["old-read"]["pending_reconcile"] is False
    assert got["recent-1"]["proxmox"] == "not_found", got["recent-1"]  # no qmstop of VM 102 ran
    assert "reconciled:unverifiable 2" in (tmp_path / "serve.log").read_text()
    v = verify(env)
    assert v.returncode == 0, v.stderr


@pytest.fixture
def all_online_sim(tmp_path: Path) -> Iterator[Any]:
    """The small scenario with pve3 online too: every node's status is the test's to set (offline_nodes)."""
    from gateway.sim.harness import start_simulator

    text = scenario_path("small").read_text()
    line = "{name: pve3, ip: 10.10.0.13, online: false}"
    assert line in text
    scenario = tmp_path / "small_all_online.yaml"
    scenario.write_text(text.replace(line, line.replace("false", "true")))
    handle = start_simulator(scenario, tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()


async def test_a_call_searched_on_every_node_stays_open_while_a_node_is_offline(
    all_online_sim: Any, tmp_path: Path
) -> None:
    """sdn_apply names no node: its task (reloadnetworkall) may be on any. The crashed run's apply reached
    Proxmox (a task on pve1), then pve1 went offline: its task list cannot be read, so the call is left
    open with the node named, not called `not_found`. Once pve1 is back, the task is found."""
    sim = all_online_sim
    env = env_for(tmp_path, sim)
    sim.set_faults(task_seconds=0.1)
    await _crashed_run(env, 0, _call("apply-1", "sdn_apply", target={"cluster": "default"}))
    upid = await _post(sim, "PUT", "/cluster/sdn")
    assert upid.startswith("UPID:pve1:") and ":reloadnetworkall:" in upid, upid
    sim.set_faults(offline_nodes=["pve1"])

    done = reconcile_cli(env, "--min-age", "0s", "--json")
    assert done.returncode == 1, done.stdout + done.stderr  # left open
    (left,) = json.loads(done.stdout)
    assert (left["request_id"], left["action"], left["proxmox"]) == ("apply-1", "open", "unreachable"), left
    assert "pve1 (offline)" in left["detail"], left
    assert _results(env, "apply-1") == []

    sim.set_faults(offline_nodes=[])
    done = reconcile_cli(env, "--min-age", "0s", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (res,) = _results(env, "apply-1")
    body = res["body"]
    assert body["proxmox"] == "ok" and body["task_id"] == upid and body["found_by"] == "task_list", body


async def test_the_passes_read_by_index(tmp_path: Path) -> None:
    """The audit may hold millions of records: a pass over known calls reads each by its request id, a
    pass over a time range by the time index; neither scans the table."""
    from gateway.store.reconcile import OPEN_CALL_SQL, OPEN_CALLS_SQL

    path = tmp_path / "audit.db"
    log = AuditLog(path)
    await log.open()
    await log.close()
    con = auditlib.connect(path, readonly=True)
    try:
        by_id = [str(r[3]) for r in con.execute("EXPLAIN QUERY PLAN " + OPEN_CALL_SQL, ("x",))]
        by_time = [str(r[3]) for r in con.execute("EXPLAIN QUERY PLAN " + OPEN_CALLS_SQL, (-math.inf, 0.0))]
    finally:
        con.close()
    assert by_id[0] == "SEARCH d USING INDEX audit_request (request_id=?)", by_id
    assert by_time[0].startswith("SEARCH d USING INDEX audit_ts"), by_time
    for plan in (by_id, by_time):  # each call's settling record looked up by its request id
        assert any("SEARCH r USING INDEX audit_request" in step for step in plan), plan
        assert not any(step.startswith("SCAN") for step in plan), plan
