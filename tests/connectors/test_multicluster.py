"""Two clusters behind one gateway: the `cluster` argument picks the simulator a call
reaches, the default is the first configured cluster, an unknown one is an invalid
argument that sends nothing, the policy sees target.cluster, and the audit records it.

alpha = the `small` scenario (PVE 8.4, nodes pve1..3), beta = `second` (PVE 9.1, nodes
edge1..3). Both have a vmid 100 (web01 on alpha, edge-gw on beta), so a wrong route
shows in the answer as well as in the simulators' request logs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import Api, outcome, text
from tests.support import GatewayThread, audit_rows, free_port

ALPHA_ONLY = {
    "name": "alpha-only-viewer",
    "role": "viewer",
    "subjects": ["alpha-agent"],
    "scope": {"clusters": ["alpha"]},
}


def policy_dir(root: Path) -> Path:
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    data["bindings"].append(ALPHA_ONLY)
    data["quotas"] = [{"name": "generous", "counter": "all", "window": "1m", "limit": 100000}]
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from gateway.sim.harness import start_simulator

    alpha = start_simulator("small", tmp_path_factory.mktemp("mc-alpha"), ssh=False)
    try:
        beta = start_simulator("second", tmp_path_factory.mktemp("mc-beta"), ssh=False)
    except BaseException:
        alpha.stop()
        raise
    yield {"alpha": alpha, "beta": beta}
    beta.stop()
    alpha.stop()


@pytest.fixture(scope="module")
def mc(sims: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    policy = policy_dir(tmp_path_factory.mktemp("mc-policy"))
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    env = make_env(tmp_path_factory.mktemp("mc-gw"), sims, port=free_port(), opa=opa)
    assert list(env.config.clusters) == ["alpha", "beta"]
    gw = GatewayThread(env.config).start()
    yield Api(env)
    gw.stop()


def clear(sims: dict[str, Any]) -> None:
    for s in sims.values():
        s.clear_logs()


def reached(sim: Any) -> list[tuple[str, str]]:
    return [(e["method"], e["path"]) for e in sim.requests_log()]


def auditor(api: Api) -> str:
    return api.env.token("mc-auditor", ["auditor"])


STATUS_100 = {
    "alpha": ("web01", "/api2/json/nodes/pve1/qemu/100/status/current"),
    "beta": ("edge-gw", "/api2/json/nodes/edge1/qemu/100/status/current"),
}


@pytest.mark.parametrize(("cluster", "expect"), [(None, "alpha"), ("alpha", "alpha"), ("beta", "beta")])
async def test_cluster_argument_picks_the_simulator(
    mc: Api, sims: dict[str, Any], cluster: str | None, expect: str
) -> None:
    other = "beta" if expect == "alpha" else "alpha"
    args: dict[str, Any] = {"vmid": 100} | ({"cluster": cluster} if cluster else {})
    clear(sims)
    res = await mc.call(auditor(mc), "get_guest_status", args)
    assert outcome(res) == "allowed", res
    name, path = STATUS_100[expect]
    assert res["structuredContent"]["name"] == name
    assert ("GET", path) in reached(sims[expect])
    assert reached(sims[other]) == []  # not even a target lookup on the other cluster

    clear(sims)
    nodes = await mc.call(auditor(mc), "list_nodes", {"cluster": cluster} if cluster else {})
    want = {"alpha": {"pve1", "pve2", "pve3"}, "beta": {"edge1", "edge2", "edge3"}}[expect]
    assert {r["node"] for r in nodes["structuredContent"]["items"]} == want
    assert reached(sims[other]) == []


async def test_unknown_cluster_is_an_invalid_argument_and_sends_nothing(mc: Api, sims: dict[str, Any]) -> None:
    clear(sims)
    res = await mc.call(auditor(mc), "get_guest_status", {"vmid": 100, "cluster": "gamma"})
    assert outcome(res) == "invalid" and res["isError"] is True, res
    assert "unknown cluster 'gamma'; configured: alpha, beta" in text(res)
    rows = audit_rows(mc.env.config.audit_path, res["_meta"]["pvegate/request_id"])
    assert [(r["kind"], r["outcome"]) for r in rows] == [("refusal", "invalid")]

    bad = await mc.call(auditor(mc), "list_nodes", {"cluster": "../alpha"})  # not even a cluster name
    assert outcome(bad) == "invalid" and "cluster" in text(bad), bad
    assert reached(sims["alpha"]) == [] and reached(sims["beta"]) == []


async def test_a_binding_scoped_to_one_cluster(mc: Api, sims: dict[str, Any]) -> None:
    agent = mc.env.token("alpha-agent", [])  # only the alpha-only-viewer binding applies
    for cluster in ("alpha", None):
        res = await mc.call(agent, "list_guests", {"cluster": cluster} if cluster else {})
        assert outcome(res) == "allowed", res
        assert {"web01", "db01"} <= {g["name"] for g in res["structuredContent"]["items"]}

    clear(sims)
    for tool, args in (("list_guests", {"cluster": "beta"}), ("get_guest_status", {"vmid": 100, "cluster": "beta"})):
        res = await mc.call(agent, tool, args)
        assert outcome(res) == "denied", res
        rows = audit_rows(mc.env.config.audit_path, res["_meta"]["pvegate/request_id"])
        decision = next(r for r in rows if r["kind"] == "decision")
        assert decision["outcome"] == "deny" and decision["target"].startswith("beta")
    # only the target lookup (facts for the policy) reached beta; no read was served
    assert {p for _, p in reached(sims["beta"])} <= {"/api2/json/cluster/resources"}
    assert reached(sims["alpha"]) == []

    # the same principal, the same tool and arguments on alpha: allowed (the scope, not the tool, decided)
    res = await mc.call(agent, "get_guest_status", {"vmid": 100, "cluster": "alpha"})
    assert outcome(res) == "allowed" and res["structuredContent"]["name"] == "web01", res


async def test_a_mutation_reaches_only_its_cluster_and_the_audit_names_it(mc: Api, sims: dict[str, Any]) -> None:
    admin = mc.human("mc-admin", ["pve-admins"])
    clear(sims)
    res = await mc.call(admin, "vm_start", {"vmid": 102, "cluster": "beta"})  # edge-test, stopped, on edge3
    assert outcome(res) == "allowed", res
    assert ("POST", "/api2/json/nodes/edge3/qemu/102/status/start") in reached(sims["beta"])
    assert reached(sims["alpha"]) == []  # alpha's 102 (win-build, stopped) is untouched
    assert sims["alpha"].state()["guests"]["102"]["status"] == "stopped"
    assert sims["beta"].state()["guests"]["102"]["status"] == "running"

    rows = audit_rows(mc.env.config.audit_path, res["_meta"]["pvegate/request_id"])
    assert [r["kind"] for r in rows] == ["received", "decision", "dispatch", "result"]
    assert {r["target"] for r in rows} == {"beta/qemu/102"}
    received = json.loads(rows[0]["body"])
    assert received["target"]["cluster"] == "beta" and received["target"]["node"] == "edge3"
    assert received["arguments"]["cluster"] == "beta"
