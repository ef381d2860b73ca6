"""A prune whose UPID was lost is found in the node's task list by the worker id Proxmox gives it
(PruneBackups.pm: `<vmid>@<storage>` for one guest's backups, `<storage>` for the whole storage;
`task_worker_id` in connectors/backups.yaml), never by a `vmid` filter, which Proxmox compares to
the task's id and which would hide the task: a prune that ran, its backups deleted, is never
recorded `not_found`. The simulator's task list and its storage are the witnesses."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx

from gateway.dev.devenv import DevEnv, make_env
from gateway.store.audit import AuditLog, AuditRecord
from tests.outcomes.helpers import (
    Gateway,
    call,
    new_port,
    reconcile_all,
    reconciled,
    records,
    request_ids,
    sim_tasks,
    task_stopped,
    verify,
    wait_for,
)
from tests.support import GENEROUS_QUOTAS, example_policy, free_port

PRUNE = {"node": "pve2", "storage": "local", "keep": "keep-last=1", "vmid": 103}


def _prune_allowed(data: dict[str, Any]) -> None:
    """The example policy with a prune (destroy-class) allowed at once for an admin: a maintenance window
    always open, no approval asked."""
    data["quotas"] = GENEROUS_QUOTAS
    days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    data["guardrails"]["maintenance_windows"] = [{"name": "always", "weekdays": days, "from_hour": 0, "to_hour": 24}]
    data["approval"]["rules"] = []
    data["approval"]["required_from_level"] = "critical"


def _env(tmp: Path, sim: Any) -> DevEnv:
    state = tmp / "state"
    extra = {
        "state_dir": str(state),
        "audit": {"path": str(state / "audit.db"), "min_free_mb": 1},
        "shutdown_grace_seconds": 2,
    }
    opa = example_policy(tmp / "policy", _prune_allowed)
    return make_env(tmp / "gw", {"default": sim}, port=free_port(), extra=extra, opa=opa)


async def _backups(env: DevEnv, token: str) -> list[dict[str, Any]]:
    got = await call(env, token, "backup_prune_preview", PRUNE)
    assert got.status == 200 and got.doc is not None, got.text[:400]
    items: list[dict[str, Any]] = got.doc["result"]["structuredContent"]["items"]
    return items


async def test_sigkill_after_a_prunes_answer_is_found_by_its_worker_id(fsim: Any, tmp_path: Path) -> None:
    env = _env(tmp_path, fsim)
    db = env.config.audit_path
    token = env.token("dana", [], groups=["pve-admins"], kind="human")
    gw = await Gateway(env, tmp_path / "serve.log", fault="kill-after-dispatch-response").start().wait_up()
    try:
        before = await _backups(env, token)
        marks = [r["mark"] for r in before]
        assert marks.count("keep") == 1 and marks.count("remove") >= 2, before
        try:
            await call(env, token, "backup_prune", PRUNE, timeout=30)
            raise AssertionError("the gateway answered; the fault hook did not fire")
        except Exception:  # the killed gateway's client sees a transport error
            pass
        assert gw.proc is not None and gw.proc.wait(timeout=30) == -9
    finally:
        gw.kill()
    (rid,) = request_ids(db, "backup_prune")
    assert [r["kind"] for r in records(db, rid)] == ["received", "decision"]  # no UPID on disk
    task = await wait_for(
        lambda: [t for t in sim_tasks(fsim) if t["type"] == "prunebackups" and t["status"] == "stopped"],
        20,
        "the prune task",
    )
    assert len(task) == 1 and task[0]["id"] == "103@local", task  # PVE's worker id for one guest's backups

    env = new_port(env)
    gw = await Gateway(env, tmp_path / "serve.log").start().wait_up()
    try:
        got = await wait_for(
            lambda: [r for r in records(db, rid) if r["kind"] == "result"], 40, "the reconciled result"
        )
        after = await _backups(env, token)
    finally:
        gw.stop()
    assert len(got) == 1 and got[0]["outcome"] == "reconciled", got
    body = got[0]["body"]
    assert body["proxmox"] == "ok" and body["found_by"] == "task_list" and body["task_id"] == task[0]["upid"], body
    assert [r["mark"] for r in after] == ["keep"]  # it ran: the other backups are gone
    # the task list was asked for prune tasks without a vmid filter (Proxmox would compare it to `103@local`)
    searches = [
        parse_qs(r["query"])
        for r in fsim.requests_log()
        if r["method"] == "GET" and r["path"].endswith("/nodes/pve2/tasks")
    ]
    assert searches and all(q.get("typefilter") == ["prunebackups"] and "vmid" not in q for q in searches), searches
    v = verify(env)
    assert v.returncode == 0, v.stderr


async def _delete(sim: Any, path: str) -> dict[str, Any]:
    """A prune sent with the gateway's own token (as a gateway that died since sent it): its finished task."""
    r = httpx.request(
        "DELETE",
        sim.api_url.rstrip("/") + path,
        headers={"Authorization": "PVEAPIToken=" + sim.tokens["admin"]},
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
    )
    assert r.status_code == 200, r.text[:300]
    upid = str(r.json()["data"])
    return await task_stopped(sim, upid)


async def test_a_prune_is_matched_by_the_form_its_call_fills(fsim: Any, tmp_path: Path) -> None:
    """Two prunes on `local` whose gateway died before recording their UPIDs: one of guest 103's backups
    whose target has no vmid (a guest the cluster did not list: the argument names it), one of the whole
    storage; then both tasks run. Each call is matched to its own task (`103@local`, `local`), never the
    other's, by `pvegate audit reconcile`."""
    env = _env(tmp_path, fsim)
    target = {"cluster": "default", "node": "pve2", "storage": "local", "vmid": None, "known": False}
    one = {**PRUNE}
    whole = {k: v for k, v in PRUNE.items() if k != "vmid"}
    log = AuditLog(env.config.audit_path, head_key=env.config.audit_key_path)
    await log.open()
    try:
        for rid, args in (("prune-one", one), ("prune-all", whole)):
            await log.append(
                AuditRecord(
                    rid, "received", "crash-probe", "backup_prune", "default", None,
                    {"target": target, "arguments": args, "effect": "destroy"},
                ),
                AuditRecord(rid, "decision", "crash-probe", "backup_prune", "default", "allow", {"allow": True}),
            )  # fmt: skip
    finally:
        await log.close()
    time.sleep(0.05)
    # the whole storage's first (keep-last=5 deletes nothing of 103's: the next prune still has work)
    everything = await _delete(fsim, "/nodes/pve2/storage/local/prunebackups?prune-backups=keep-last%3D5")
    guest = await _delete(fsim, "/nodes/pve2/storage/local/prunebackups?prune-backups=keep-last%3D1&vmid=103")
    assert (everything["id"], guest["id"]) == ("local", "103@local")
    reconcile_all(env)

    def result(rid: str) -> dict[str, Any]:
        return reconciled(env.config.audit_path, rid)

    assert (result("prune-one")["proxmox"], result("prune-one")["task_id"]) == ("ok", guest["upid"])
    assert (result("prune-all")["proxmox"], result("prune-all")["task_id"]) == ("ok", everything["upid"])
