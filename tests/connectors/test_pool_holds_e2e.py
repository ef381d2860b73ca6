"""A pool limit holds under concurrency: SDK clients -> HTTPS -> JWT -> real OPA -> gateway -> simulator.

Each allocating call holds what it asks for on its pool before the pool's usage is read
(gateway/store/holds.py), so calls decided at once see each other: with room for one more guest
in the pool, one of several concurrent creates is allowed, not all of them. The holds are given
back when a call ends; what another replica holds (a hold taken here by hand) counts too. The
policy is the repository's library and example data, pool `sandbox` capped at one guest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import load
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.store.db import DatabaseUnavailable
from gateway.store.holds import MemoryHolds
from tests.connectors.test_provision_e2e import answered, call, text
from tests.outcomes.helpers import wait_for
from tests.support import GatewayThread, audit_rows, example_env, kept_input, mutations


@pytest.fixture(scope="module")
def hsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("hold-sim"), ssh=False)
    yield handle
    handle.stop()


def sandbox_capped_at(guests: int) -> Callable[[dict[str, Any]], None]:
    """A policy-data edit: provisioners may have at most `guests` guests in the sandbox pool."""

    def edit(data: dict[str, Any]) -> None:
        for q in data["resource_quotas"]:
            if q["name"] == "provisioners-in-sandbox":
                q["max_pool_total"] = {"guests": guests}

    return edit


@pytest.fixture(scope="module")
def henv(hsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return example_env(tmp_path_factory.mktemp("holds"), hsim, sandbox_capped_at(1))


@pytest.fixture(scope="module")
def hgw(henv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(henv.config).start()
    yield gw
    gw.stop()


def provisioner(env: DevEnv) -> str:
    return env.token("hold-agent", ["provisioner"], kind="agent")


def create(vmid: int) -> dict[str, Any]:
    return {"node": "pve1", "vmid": vmid, "pool": "sandbox", "cores": 1, "memory": 256}


async def empty_sandbox(env: DevEnv, sim: Any) -> None:
    """The guests earlier tests put in pool sandbox leave it (an admin's call): room for one again."""
    placed = [g for g, v in sim.state()["guests"].items() if v.get("pool") == "sandbox"]
    if placed:
        res = await answered(env, "pool_members_remove", {"poolid": "sandbox", "vmids": ",".join(placed)})
        assert not res.is_error, text(res)


def holds(gw: GatewayThread) -> MemoryHolds:
    h = gw.components.holds
    assert isinstance(h, MemoryHolds)  # SQLite: this process's holds
    return h


def on_loop(gw: GatewayThread, coro: Any) -> Any:
    assert gw.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(timeout=30)


async def test_concurrent_creates_into_a_pool_with_room_for_one_allow_one(
    hgw: GatewayThread, henv: DevEnv, hsim: Any
) -> None:
    env, sim = henv, hsim
    token = provisioner(env)
    sim.clear_logs()
    results = await asyncio.gather(*(call(env, token, "vm_create", create(vmid)) for vmid in range(170, 175)))
    allowed = [r for r in results if not r.is_error]
    refused = [r for r in results if r.is_error]
    assert len(allowed) == 1, [text(r) for r in results]
    for r in refused:
        assert "quota.resource_pool_total" in r.structured_content["codes"], text(r)
    assert [m for m in mutations(sim) if m[0] == "POST"] == [("POST", "/api2/json/nodes/pve1/qemu")]
    assert holds(hgw).held() == 0  # every call gave its hold back
    # the pool is full now: one after another, as before
    res = await call(env, token, "vm_create", create(176))
    assert res.is_error and "quota.resource_pool_total" in res.structured_content["codes"], text(res)
    assert holds(hgw).held() == 0


async def test_what_another_call_holds_counts_and_is_shown(hgw: GatewayThread, henv: DevEnv, hsim: Any) -> None:
    env, sim = henv, hsim
    token = provisioner(env)
    # make room: the guest the test above created leaves the pool
    assert len([v for v in sim.state()["guests"].values() if v.get("pool") == "sandbox"]) == 1
    await empty_sandbox(env, sim)

    # a create in flight elsewhere (another replica's, or one Proxmox still runs) holds one guest
    before, handle = on_loop(hgw, holds(hgw).take("default", "sandbox", {"guests": 1}))
    assert before == {"guests": 0, "cores": 0, "memory_mib": 0, "disk_gib": 0}
    sim.clear_logs()
    res = await call(env, token, "vm_create", create(177))
    assert res.is_error and "quota.resource_pool_total" in res.structured_content["codes"], text(res)
    assert "1 of them for calls still in flight" in text(res), text(res)
    assert mutations(sim) == []
    rows = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "decision" and r["tool"] == "vm_create"]
    facts = kept_input(rows[-1])["resources"]
    assert facts["pool_in_flight"] == {"guests": 1, "cores": 0, "memory_mib": 0, "disk_gib": 0}, facts
    assert facts["pool_usage"]["guests"] == 1, facts

    # the refused call gave its own hold back; once the other is given back, the pool has room again
    assert holds(hgw).held() == 1
    on_loop(hgw, holds(hgw).give_back(handle))
    res = await call(env, token, "vm_create", create(177))
    assert not res.is_error, text(res)
    assert holds(hgw).held() == 0


def impatient_env(tmp_path: Path, sim: Any) -> DevEnv:
    """The sandbox capped at 10 guests, on a cluster whose answers the gateway waits 1 s for."""
    env = example_env(tmp_path, sim, sandbox_capped_at(10))
    raw = yaml.safe_load(env.config_path.read_text())
    raw["clusters"][0]["timeout"] = 1.0
    env.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    env.config = load(env.config_path)
    return env


async def test_a_create_left_to_reconciliation_keeps_its_hold_until_it_is_settled(hsim: Any, tmp_path: Path) -> None:
    """Its answer lost, the create is `interrupted`: Proxmox may still be making the guest, so the
    call keeps its hold; reconciliation finds the task and settles the call, and gives the hold back."""
    sim = hsim
    env = impatient_env(tmp_path, sim)  # the gateway gives up on the answer after 1 s ...
    gw = GatewayThread(env.config).start()
    try:
        # ... while Proxmox starts the create at once and answers the POST 2.5 s later
        sim.set_faults(answer_delay_ms=2500, answer_delay_path=r"^/nodes/pve1/qemu$", task_seconds=0.5)
        try:
            res = await call(env, provisioner(env), "vm_create", create(178))
        finally:
            sim.set_faults(answer_delay_ms=0, answer_delay_path=None, task_seconds=None)
        assert res.is_error and "interrupted" in text(res), text(res)
        assert holds(gw).held() == 1  # kept: the guest may not be listed yet
        await wait_for(lambda: holds(gw).held() == 0, 60, "the hold given back when the call is settled")
        settled = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "result" and r["tool"] == "vm_create"]
        assert [r["outcome"] for r in settled] == ["interrupted", "reconciled"], settled
    finally:
        gw.stop()


async def test_only_a_call_allowed_to_be_sent_takes_a_hold(hgw: GatewayThread, henv: DevEnv, hsim: Any) -> None:
    """A principal the policy refuses (or a dry run) takes no hold: none can block a pool for the
    others by asking for more than it may have; the allowed call is decided again under its hold."""
    env = henv
    taken: list[dict[str, int]] = []
    h = holds(hgw)
    real = h.take

    async def spy(cluster: str, pool: str, amounts: Any, request_id: str = "") -> Any:
        taken.append(dict(amounts))
        return await real(cluster, pool, amounts, request_id)

    await empty_sandbox(env, hsim)
    h.take = spy  # type: ignore[method-assign]
    try:
        huge = {**create(179), "disk_storage": "local-lvm", "disk_gib": 65536}
        res = await call(env, env.token("hold-auditor", ["auditor"], kind="agent"), "vm_create", huge)
        assert res.is_error and taken == [], text(res)  # denied (no role creates): no hold
        async with mcp_client(env.url, provisioner(env), env.ca_file) as client:
            res = await client.call_tool("vm_create", create(179), meta={"dry_run": True})
        assert not res.is_error and taken == [], text(res)  # a rehearsal allocates nothing
        res = await call(env, provisioner(env), "vm_create", create(179))
        assert not res.is_error and taken == [{"guests": 1, "cores": 1, "memory_mib": 256, "disk_gib": 0}], text(res)
        res = await call(env, provisioner(env), "vm_create", create(180))  # the pool is full now
        assert res.is_error and "quota.resource_pool_total" in res.structured_content["codes"], text(res)
        assert len(taken) == 1  # denied the first time: never held
    finally:
        h.take = real  # type: ignore[method-assign]


async def test_a_holds_store_that_fails_refuses_that_call_alone(hgw: GatewayThread, henv: DevEnv, hsim: Any) -> None:
    env, sim = henv, hsim
    h = holds(hgw)
    real, gone = h.take, h.give_back_call

    async def down(*_: Any, **__: Any) -> Any:
        raise DatabaseUnavailable("PostgreSQL cannot be reached (connection refused)")

    await empty_sandbox(env, sim)
    h.take = down  # type: ignore[method-assign]
    try:
        sim.clear_logs()
        res = await call(env, provisioner(env), "vm_create", create(181))
        assert res.is_error and "holds cannot be taken now (DatabaseUnavailable)" in text(res), text(res)
        assert "PostgreSQL" not in text(res)  # the operator's detail is logged, not told to the agent
        assert mutations(sim) == []
        # not the audit's failure: the next call, anyone's, is served at once
        res = await call(env, env.token("hold-viewer", ["viewer"], kind="agent"), "list_nodes", {})
        assert not res.is_error, text(res)
        refusals = [r for r in audit_rows(env.config.audit_path) if r["outcome"] == "holds_unavailable"]
        assert len(refusals) == 1 and refusals[0]["tool"] == "vm_create"
    finally:
        h.take, h.give_back_call = real, gone  # type: ignore[method-assign]


async def test_a_restart_takes_the_holds_of_calls_still_open_again(hsim: Any, tmp_path: Path) -> None:
    """SQLite keeps the holds in the process: a gateway restarted while an interrupted create still
    runs in Proxmox takes its hold again from the call's decision record before it serves, keeps it
    while the task runs, and gives it back when reconciliation settles the call."""
    sim = hsim
    env = impatient_env(tmp_path, sim)
    gw = GatewayThread(env.config).start()
    try:  # the answer comes after the gateway gave up, and the task runs on for a while
        sim.set_faults(answer_delay_ms=2500, answer_delay_path=r"^/nodes/pve1/qemu$", task_seconds=6)
        try:
            res = await call(env, provisioner(env), "vm_create", create(183))
        finally:
            sim.set_faults(answer_delay_ms=0, answer_delay_path=None)
        assert res.is_error and "interrupted" in text(res), text(res)
        assert holds(gw).held() == 1
    finally:
        gw.stop()  # before reconciliation settles it: the task still runs
    rid = next(r["request_id"] for r in audit_rows(env.config.audit_path) if r["tool"] == "vm_create")
    gw = GatewayThread(env.config).start()
    try:
        held = [(key, amounts, r) for key, amounts, _, r in holds(gw)._held.values()]
        assert held == [(("default", "sandbox"), {"guests": 1, "cores": 1, "memory_mib": 256, "disk_gib": 0}, rid)]
        await wait_for(lambda: holds(gw).held() == 0, 60, "the hold given back when the call is settled")
        settled = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "result" and r["tool"] == "vm_create"]
        assert [r["outcome"] for r in settled] == ["interrupted", "reconciled"], settled
    finally:
        gw.stop()
        sim.set_faults(task_seconds=None)


async def test_guests_put_into_a_pool_count_against_its_quota(hsim: Any, tmp_path: Path) -> None:
    """pool_members_add makes a pool hold what its guests hold: a pool's total is capped for it as
    for a create (allocates.members_of), a guest already in the pool adds nothing."""
    sim = hsim

    def edit(data: dict[str, Any]) -> None:
        data["resource_quotas"].append({"name": "sandbox-cap", "pools": ["sandbox"], "max_pool_total": {"guests": 1}})

    env = example_env(tmp_path, sim, edit)
    gw = GatewayThread(env.config).start()
    try:
        await empty_sandbox(env, sim)
        sim.clear_logs()
        res = await answered(env, "pool_members_add", {"poolid": "sandbox", "vmids": "102,103", "allow_move": True})
        assert res.is_error and "quota.resource_pool_total" in res.structured_content["codes"], text(res)
        assert "pool sandbox holds 0 guests and the call adds 2" in text(res), text(res)
        assert mutations(sim) == []
        res = await answered(env, "pool_members_add", {"poolid": "sandbox", "vmids": "102", "allow_move": True})
        assert not res.is_error, text(res)
        assert sim.state()["guests"]["102"]["pool"] == "sandbox"
        rows = [r for r in audit_rows(env.config.audit_path) if r["kind"] == "decision"]
        facts = kept_input(rows[-1])["resources"]
        assert facts["requested"] == {"guests": 1, "cores": 4, "memory_mib": 8192, "disk_gib": 80}, facts
        # already in it: adds nothing, so the full pool takes it
        res = await answered(env, "pool_members_add", {"poolid": "sandbox", "vmids": "102"})
        assert not res.is_error, text(res)
        # a guest the gateway cannot see cannot be counted: refused, not guessed
        res = await answered(env, "pool_members_add", {"poolid": "sandbox", "vmids": "999", "allow_move": True})
        assert res.is_error and "quota.resource_facts_missing" in res.structured_content["codes"], text(res)
        assert holds(gw).held() == 0
    finally:
        await empty_sandbox(env, sim)
        res = await answered(env, "pool_members_add", {"poolid": "lab", "vmids": "102", "allow_move": True})
        gw.stop()
