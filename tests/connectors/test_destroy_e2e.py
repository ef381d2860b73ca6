"""The three destroy tools end to end through the gateway and the real OPA: held for an
SRE lead's approval, approved by a human through the admin API, retried with the
one-time token, performed by the simulator and audited.

The policy is the repo's library and data, with two changes that make the test
independent of the clock: the maintenance window covers every hour of every day
(or, for the second gateway, there is no window at all), and quotas are generous.
The approval rule (destroy-needs-sre-lead), the protected tag and the break-glass
rule are the shipped ones.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, outcome, text
from tests.support import GatewayThread, audit_rows, example_env, mutations

ALWAYS = [
    {"name": "always", "weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "from_hour": 0, "to_hour": 24}
]


def gateway_env(tmp: pytest.TempPathFactory, sim: Any, name: str, windows: list[dict[str, Any]]) -> DevEnv:
    def edit(data: dict[str, Any]) -> None:
        data["guardrails"]["maintenance_windows"] = windows

    return example_env(tmp.mktemp(name), sim, edit)


@pytest.fixture(scope="module")
def dsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("dsim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def win(dsim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """A gateway whose maintenance window is always open."""
    env = gateway_env(tmp_path_factory, dsim, "dwin", ALWAYS)
    gw = GatewayThread(env.config).start()
    yield Api(env)
    gw.stop()


@pytest.fixture(scope="module")
def nowin(dsim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """A gateway with no maintenance window at all: every hour is outside one."""
    env = gateway_env(tmp_path_factory, dsim, "dnowin", [])
    gw = GatewayThread(env.config).start()
    yield Api(env)
    gw.stop()


def admin(api: Api, sub: str = "dana") -> str:
    return api.human(sub, ["pve-admins"])  # binding `admins`: role admin for humans in pve-admins


def alice(api: Api) -> str:
    return api.human("alice", ["sre-leads"])


def guest(sim: Any, vmid: int) -> dict[str, Any] | None:
    g: dict[str, Any] | None = sim.state()["guests"].get(str(vmid))
    return g


async def setup_call(api: Api, tool: str, args: dict[str, Any]) -> None:
    """A write the admin may do without approval (it prepares the destroy under test)."""
    res = await api.call(admin(api), tool, args)
    assert outcome(res) == "allowed", res


async def held_then_approved(api: Api, sim: Any, token: str, tool: str, args: dict[str, Any]) -> tuple[str, str]:
    """The call is held (nothing sent), alice approves it: (approval id, one-time token)."""
    sim.clear_logs()
    res = await api.call(token, tool, args)
    assert outcome(res) == "pending_approval", res
    info = res["structuredContent"]["approval"]
    assert info["approver_groups"] == ["sre-leads"] and info["min_approvals"] == 1, info
    assert "SRE lead" in info["reason"]
    assert mutations(sim) == []  # held: nothing reached Proxmox
    vote = await api.vote(info["id"], alice(api))
    assert vote.status_code == 200 and vote.json()["state"] == "approved", vote.text
    return str(info["id"]), str(vote.json()["token"])


async def retry_runs(api: Api, sim: Any, token: str, tool: str, args: dict[str, Any], aid: str, approval: str) -> Any:
    """The retry with the token runs; its audit trail is consumed approval, received,
    an allow decision that names the approval, the dispatch (its UPID) and the result."""
    sim.clear_logs()
    res = await api.call(token, tool, args, approval=approval)
    assert outcome(res) == "allowed", res
    rid = res["_meta"]["pvegate/request_id"]
    rows = audit_rows(api.env.config.audit_path, rid)
    assert [(r["kind"], r["outcome"]) for r in rows] == [
        ("approval", "consumed"),
        ("received", None),
        ("decision", "allow"),
        ("dispatch", "accepted"),
        ("result", "ok"),
    ], rows
    decision = json.loads(rows[2]["body"])
    assert decision["allow"] is True and decision["approval_presented"] == aid
    assert decision["approval"]["required"] is True and decision["approval"]["satisfied"] is True
    assert decision["approval"]["approver_groups"] == ["sre-leads"]
    assert json.loads(rows[3]["body"])["task_id"] == res["structuredContent"]["upid"]
    assert json.loads(rows[4]["body"])["task_id"] == res["structuredContent"]["upid"]
    assert all(r["tool"] == tool for r in rows)
    return res


async def test_snapshot_delete_needs_an_sre_lead_then_runs(win: Api, dsim: Any) -> None:
    args = {"vmid": 202, "snapname": "e2e_del"}
    await setup_call(win, "snapshot_create", args)
    assert "e2e_del" in guest(dsim, 202)["snapshots"]  # type: ignore[index]

    aid, token = await held_then_approved(win, dsim, admin(win), "snapshot_delete", args)
    # an approver outside sre-leads cannot approve a destroy (the rule names the group)
    aid2 = (await win.call(admin(win, "erin"), "snapshot_delete", args))["structuredContent"]["approval"]["id"]
    bob = await win.vote(aid2, win.human("bob", ["ops-approvers"]))
    assert bob.status_code == 403, bob.text
    assert "e2e_del" in guest(dsim, 202)["snapshots"]  # type: ignore[index]

    res = await retry_runs(win, dsim, admin(win), "snapshot_delete", args, aid, token)
    assert res["structuredContent"]["exitstatus"] == "OK"
    assert mutations(dsim) == [("DELETE", "/api2/json/nodes/pve2/lxc/202/snapshot/e2e_del")]
    assert "e2e_del" not in guest(dsim, 202)["snapshots"]  # type: ignore[index]

    replay = await win.call(admin(win), "snapshot_delete", args, approval=token)  # one-time
    assert outcome(replay) == "denied" and "already used" in text(replay)


async def test_snapshot_rollback_needs_an_sre_lead_then_runs(win: Api, dsim: Any) -> None:
    args = {"vmid": 102, "snapname": "e2e_rb"}
    await setup_call(win, "snapshot_create", args)
    aid, token = await held_then_approved(win, dsim, admin(win), "snapshot_rollback", args)
    res = await retry_runs(win, dsim, admin(win), "snapshot_rollback", args, aid, token)
    assert mutations(dsim) == [("POST", "/api2/json/nodes/pve2/qemu/102/snapshot/e2e_rb/rollback")]
    upid = res["structuredContent"]["upid"]
    task = next(t for t in dsim.state()["tasks"] if t["upid"] == upid)
    assert task["type"] == "qmrollback" and task["id"] == "102"
    assert task["status"] == "stopped" and task["exitstatus"] == "OK"


async def test_guest_delete_needs_an_sre_lead_then_runs(win: Api, dsim: Any) -> None:
    await setup_call(win, "guest_clone", {"vmid": 9000, "newid": 151, "name": "e2e-del"})
    assert guest(dsim, 151) is not None
    args = {"vmid": 151, "purge": True}
    aid, token = await held_then_approved(win, dsim, admin(win), "guest_delete", args)
    assert guest(dsim, 151) is not None
    await retry_runs(win, dsim, admin(win), "guest_delete", args, aid, token)
    assert mutations(dsim) == [("DELETE", "/api2/json/nodes/pve1/qemu/151")]
    assert guest(dsim, 151) is None


async def test_protected_guest_is_never_deleted(win: Api, dsim: Any) -> None:
    # db01 (101) carries the protected tag: a plain deny, no approval is even offered
    dsim.clear_logs()
    res = await win.call(admin(win), "guest_delete", {"vmid": 101})
    assert outcome(res) == "denied" and 'tagged "protected"' in text(res), res
    assert "approval" not in res["structuredContent"]
    rows = audit_rows(win.env.config.audit_path, res["_meta"]["pvegate/request_id"])
    assert [(r["kind"], r["outcome"]) for r in rows] == [("received", None), ("decision", "deny")]

    # an admin holding a valid approval, for a guest someone tagged protected in Proxmox
    # itself (not through the gateway) after the approval was granted, a moment ago
    await setup_call(win, "guest_clone", {"vmid": 9000, "newid": 152, "name": "e2e-prot"})
    args = {"vmid": 152}
    aid, token = await held_then_approved(win, dsim, admin(win), "guest_delete", args)
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(dsim.ca_file))) as http:
        r = await http.put(
            f"{dsim.api_url}/nodes/pve1/qemu/152/config",
            data={"tags": "dev;protected"},
            headers={"Authorization": f"PVEAPIToken={dsim.tokens['admin']}"},
        )
    assert r.status_code == 200, r.text
    assert guest(dsim, 152)["tags"] == ["dev", "protected"]  # type: ignore[index]
    dsim.clear_logs()
    res = await win.call(admin(win), "guest_delete", args, approval=token)
    # the token is bound to the guest's tags (store/approvals.py target_key): a guest tagged since the vote
    # is another target, so the approval is refused before anything is decided on it
    assert outcome(res) == "denied" and f"approval {aid} was granted for another target" in text(res), res
    rows = audit_rows(win.env.config.audit_path, res["_meta"]["pvegate/request_id"])
    assert not any(r["kind"] == "result" for r in rows), rows
    assert mutations(dsim) == []  # nothing reached Proxmox
    # asked again without the token, the guard rail refuses: no approval is even offered
    again = await win.call(admin(win), "guest_delete", args)
    assert outcome(again) == "denied" and 'tagged "protected"' in text(again), again
    assert "approval" not in again["structuredContent"]
    assert guest(dsim, 101) is not None and guest(dsim, 152) is not None


async def test_outside_the_window_only_break_glass_with_approval(nowin: Api, dsim: Any) -> None:
    args = {"vmid": 202, "snapname": "e2e_bg"}
    await setup_call(nowin, "snapshot_create", args)  # writes are not bound to a window

    dsim.clear_logs()
    for tool, a in (("snapshot_delete", args), ("guest_delete", {"vmid": 202})):
        res = await nowin.call(admin(nowin), tool, a)
        assert outcome(res) == "denied" and "maintenance window" in text(res), res
        assert "approval" not in res["structuredContent"]
    assert mutations(dsim) == []

    breakglass = nowin.human("breakglass-1")
    held = await nowin.call(breakglass, "snapshot_delete", args)
    assert outcome(held) == "pending_approval", held
    assert "break-glass" in held["structuredContent"]["approval"]["reason"]
    assert mutations(dsim) == []
    aid, token = await held_then_approved(nowin, dsim, breakglass, "snapshot_delete", args)
    await retry_runs(nowin, dsim, breakglass, "snapshot_delete", args, aid, token)
    assert mutations(dsim) == [("DELETE", "/api2/json/nodes/pve2/lxc/202/snapshot/e2e_bg")]
    assert "e2e_bg" not in guest(dsim, 202)["snapshots"]  # type: ignore[index]
    assert guest(dsim, 202) is not None
