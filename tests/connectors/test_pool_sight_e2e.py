"""A guest whose pool the gateway's token cannot see, end to end: MCP client -> HTTPS -> JWT ->
real OPA -> gateway -> simulator.

PVE's GET /cluster/resources deletes a guest row's `pool` unless the token has Pool.Audit on
/pool/<pool> (API2/Cluster.pm): with a hand-trimmed role, a guest in pool sandbox is listed as
a guest in no pool, and a resource quota selected by `pools: [sandbox]` used not to apply to it
(a resize or a cores change escaped the sandbox's cap). The gateway now reads the token's own
effective privileges (GET /access/permissions, cached) and says when a guest's pool cannot be
told (pool_known false); the policy checks a pool-selected quota as if it applied, and refuses
what it would refuse or cannot check (quota.resource_pool_unknown).

One gateway, three clusters on the same simulator (the scenario of test_pve_visibility_e2e plus
guest 175 in no pool): `default` with the role `pvegate tools least-privilege` prints (Pool.Audit
on every pool), `nopool` with that role less Pool.Audit, `sandboxonly` with that role less
Pool.Audit plus Pool.Audit on /pool/sandbox alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gateway.core.config import load
from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.targets import TargetResolver, sees_every_pool
from tests.approvals.conftest import Api, outcome, text
from tests.connectors.test_pve_visibility_e2e import ALWAYS, pve, scenario
from tests.support import GENEROUS_QUOTAS, GatewayThread, example_policy, free_port, mutations

# the sandbox's cap: 4 cores a guest, 3 in all (guest 170, 1 core, is its only member)
SANDBOX_CAP = {
    "name": "sandbox-cap",
    "pools": ["sandbox"],
    "max_per_guest": {"cores": 4},
    "max_pool_total": {"cores": 3},
}


@pytest.fixture(scope="module")
def psim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    tmp = tmp_path_factory.mktemp("sight-sim")
    path = scenario(tmp / "scenario.yaml")
    data = yaml.safe_load(path.read_text())
    data["guests"].append(
        {"vmid": 175, "type": "qemu", "node": "pve1", "name": "loose-1", "status": "stopped", "cores": 1,
         "memory_mb": 512, "disk_gb": 4}
    )  # fmt: skip
    no_pool = next(t for t in data["tokens"] if t["name"] == "lp-nopool")
    data["tokens"].append(
        {"name": "lp-sandbox", "tokenid": "gwlp@pve!sandbox", "privsep": True,
         "acls": [*no_pool["acls"], {"path": "/pool/sandbox", "roles": ["PVEPoolUser"]}]}
    )  # fmt: skip
    data["tokens"].append(  # Pool.Audit on /pool itself, not propagated: no pool below it is seen
        {"name": "lp-poolflat", "tokenid": "gwlp@pve!poolflat", "privsep": True,
         "acls": [*no_pool["acls"], {"path": "/pool", "roles": ["PVEPoolUser"], "propagate": False}]}
    )  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    handle = start_simulator(str(path), tmp, ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def pgw(psim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, GatewayThread]]:
    tmp = tmp_path_factory.mktemp("sight-gw")

    def edit(data: dict[str, Any]) -> None:
        data["quotas"] = GENEROUS_QUOTAS
        data["guardrails"]["maintenance_windows"] = ALWAYS
        data["resource_quotas"].append(SANDBOX_CAP)

    opa = example_policy(tmp / "policy", edit)
    env = make_env(tmp / "gw", {"default": psim, "nopool": psim, "sandboxonly": psim}, port=free_port(), opa=opa)
    secrets = env.workdir / "secrets"  # each cluster's token file (devenv.cluster_entry): the admin's, replaced
    for cluster, token in (("default", "lp"), ("nopool", "lp-nopool"), ("sandboxonly", "lp-sandbox")):
        (secrets / f"{cluster}-pve-token").write_text(psim.tokens[token] + "\n")
    env.config = load(env.config_path)
    gw = GatewayThread(env.config).start()
    yield Api(env), gw
    gw.stop()


def facts(gw: GatewayThread, cluster: str, name: str, args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(target, resources) as the gateway hands them to the policy for a call on `cluster`."""
    c = gw.components
    tool = c.catalog.get(name)
    assert tool is not None and gw.loop is not None

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        valid = tool.validate(args)
        target = await c.targets.resolve(tool, valid, cluster)
        out = await c.targets.resources(tool, valid, cluster, target)
        assert out is not None
        return target, out

    return asyncio.run_coroutine_threadsafe(run(), gw.loop).result(timeout=60)


def cores(sim: Any, vmid: int) -> int:
    return int(sim.state()["guests"][str(vmid)]["config"]["cores"])


def permission_reads(sim: Any) -> int:
    return sum(1 for e in sim.requests_log() if e["path"].endswith("/access/permissions"))


async def test_a_hidden_pool_does_not_escape_its_quota(pgw: tuple[Api, GatewayThread], psim: Any) -> None:
    api, gw = pgw
    admin = api.human("sight-dana", ["pve-admins"])

    # no Pool.Audit: guest 170 (pool sandbox) is listed in no pool; the sandbox's quota may apply
    target, res = facts(gw, "nopool", "guest_config_update", {"vmid": 170, "cores": 2})
    assert (target["pool"], target["pool_known"], res["pool"], res["pool_known"]) == (None, False, None, False)
    for cluster in ("nopool", "sandboxonly"):  # guest 175, in no pool, cannot be told from one in a hidden pool
        target, res = facts(gw, cluster, "guest_config_update", {"vmid": 175, "cores": 2})
        assert (target["pool"], target["pool_known"], res["pool_known"]) == (None, False, False), cluster

    psim.clear_logs()
    for cluster, vmid in (("nopool", 170), ("nopool", 175), ("sandboxonly", 175)):
        res = await api.call(admin, "guest_config_update", {"vmid": vmid, "cores": 2, "cluster": cluster})
        assert outcome(res) == "denied", (cluster, vmid, res)
        assert res["structuredContent"]["codes"] == ["quota.resource_pool_unknown"], text(res)
        assert f"whether guest {vmid} is in one cannot be told" in text(res), text(res)
        assert "Pool.Audit" in text(res), text(res)
    assert mutations(psim) == [] and cores(psim, 170) == 1

    # Pool.Audit on sandbox (alone, or on every pool): decided on the pool as before
    target, res = facts(gw, "sandboxonly", "guest_config_update", {"vmid": 170, "cores": 2})
    assert (target["pool"], target["pool_known"], res["pool_usage"]["cores"]) == ("sandbox", True, 1)
    res = await api.call(admin, "guest_config_update", {"vmid": 170, "cores": 2, "cluster": "sandboxonly"})
    assert outcome(res) == "allowed" and not res.get("isError"), text(res)
    assert cores(psim, 170) == 2
    psim.clear_logs()
    res = await api.call(admin, "guest_config_update", {"vmid": 170, "cores": 4})  # cluster default
    assert outcome(res) == "denied", res
    assert res["structuredContent"]["codes"] == ["quota.resource_pool_total"], text(res)
    assert "pool sandbox holds 2 cores and the call adds 2, over its limit of 3" in text(res), text(res)
    assert mutations(psim) == []

    # a guest in no pool, the token seeing every pool: no pool quota applies, as before
    target, res = facts(gw, "default", "guest_config_update", {"vmid": 175, "cores": 8})
    assert (target["pool"], target["pool_known"], res["pool"], res["pool_known"]) == (None, True, None, True)
    res = await api.call(admin, "guest_config_update", {"vmid": 175, "cores": 8})
    assert outcome(res) == "allowed" and not res.get("isError"), text(res)
    assert cores(psim, 175) == 8


async def test_the_tokens_sight_is_read_once_and_only_when_a_row_hides_a_pool(
    pgw: tuple[Api, GatewayThread], psim: Any
) -> None:
    api, gw = pgw
    admin = api.human("sight-erin", ["pve-admins"])
    facts(gw, "nopool", "guest_config_update", {"vmid": 175, "cores": 1})  # the cache is filled
    psim.clear_logs()
    for _ in range(3):  # cached: no further read of the token's privileges
        target, _res = facts(gw, "nopool", "guest_config_update", {"vmid": 175, "cores": 1})
        assert target["pool_known"] is False
    facts(gw, "sandboxonly", "guest_config_update", {"vmid": 170, "cores": 2})  # a row that shows its pool
    for cluster in ("default", "nopool", "sandboxonly"):  # no guest named: nothing to tell
        res = await api.call(admin, "list_nodes", {"cluster": cluster})
        assert outcome(res) == "allowed", text(res)
    assert permission_reads(psim) == 0, psim.requests_log()


def test_the_simulator_flags_what_propagates_as_proxmox_does(psim: Any) -> None:
    """GET /access/permissions flags each privilege with whether it propagates (PVE's
    permissions()): Pool.Audit held on /pool without propagation reaches no pool."""
    with pve(psim, "lp-poolflat") as c:
        perms = c.get("/access/permissions").json()["data"]
        assert perms["/pool"] == {"Pool.Audit": 0} and perms["/"]["VM.Audit"] == 1, perms
        assert not sees_every_pool(perms)
        rows = c.get("/cluster/resources").json()["data"]
        assert next(r for r in rows if r.get("vmid") == 170).get("pool") is None  # hidden, as PVE hides it
        assert c.get("/pools", params={"poolid": "sandbox"}).status_code == 403
    with pve(psim, "lp") as c:
        perms = c.get("/access/permissions").json()["data"]
        assert perms["/pool"]["Pool.Audit"] == 1 and sees_every_pool(perms), perms


# --- which pools a token sees, from GET /access/permissions -------------------------------------

AUDIT = {"VM.Audit": 1, "Sys.Audit": 1}


@pytest.mark.parametrize(
    ("permissions", "every"),
    [
        # Pool.Audit propagated from `/`: Proxmox answers it on /pool too, inherited
        ({"/": {"Pool.Audit": 1, **AUDIT}, "/pool": {"Pool.Audit": 1, **AUDIT}}, True),
        ({"/pool": {"Pool.Audit": 1}}, True),  # an ACL on /pool, propagated
        ({"/": {"Pool.Audit": 0, **AUDIT}}, False),  # on `/` alone: /pool does not inherit it
        ({"/": {"Pool.Audit": 1, **AUDIT}}, False),  # /pool overridden by an ACL that holds nothing
        ({"/pool": {"Pool.Audit": 0}}, False),  # on /pool itself, not below it
        ({"/pool": {"Pool.Audit": "1"}}, True),
        ({"/pool/sandbox": {"Pool.Audit": 1}}, False),  # one pool: the others are hidden
        ({"/pool/sandbox": {"Pool.Audit": 0}, "/pool/lab": {"Pool.Audit": 1}}, False),
        # every pool but one whose own ACL overrides /pool's without Pool.Audit
        ({"/pool": {"Pool.Audit": 1}, "/pool/prod": {"VM.Audit": 0}}, False),
        ({"/pool": {"Pool.Audit": 1}, "/pool/prod": {"Pool.Audit": 0}, "/pool/a/b": {"Pool.Audit": 1}}, True),
        ({"/pool": {"Pool.Audit": 1, **AUDIT}, "/vms/101": {"VM.Audit": 0}}, True),  # other paths: not pools
        ({}, False),
        (None, False),
        ([], False),
        ({"/pool": ["Pool.Audit"]}, False),
    ],
)
def test_every_pool_is_seen_only_with_pool_audit_reaching_them_all(permissions: Any, every: bool) -> None:
    assert sees_every_pool(permissions) is every


class Cluster:
    """/cluster/resources and /access/permissions as a client answers them, counting reads."""

    def __init__(self, rows: list[dict[str, Any]], permissions: Any) -> None:
        self.rows = rows
        self.permissions = permissions
        self.asked: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> Any:
        assert method == "GET", path
        self.asked.append(path)
        if path == "/cluster/resources":
            return self.rows
        assert path == "/access/permissions", path
        if isinstance(self.permissions, Exception):
            raise self.permissions
        return self.permissions


ROWS: list[dict[str, Any]] = [
    {"type": "node", "node": "pve1", "status": "online"},
    {"type": "qemu", "vmid": 101, "node": "pve1", "pool": "prod"},
    {"type": "qemu", "vmid": 175, "node": "pve1"},
    {"type": "pool", "id": "/pool/prod", "pool": "prod"},
]
EVERY = {"/pool": {"Pool.Audit": 1}}


def pool_known(resolver: TargetResolver, vmid: int) -> bool:
    tool = Catalog.load(REPO_ROOT / "connectors").get("guest_config_update")
    assert tool is not None
    target = asyncio.run(resolver.resolve(tool, tool.validate({"vmid": vmid, "cores": 1}), "default"))
    assert target["known"] and target["vmid"] == vmid
    return bool(target["pool_known"])


def test_the_tokens_sight_is_cached_while_the_pools_it_sees_stay_the_same() -> None:
    cluster = Cluster(ROWS, EVERY)
    resolver = TargetResolver({"default": cluster})  # type: ignore[dict-item]
    assert pool_known(resolver, 101) and "/access/permissions" not in cluster.asked  # the row shows it
    assert pool_known(resolver, 175) and pool_known(resolver, 175)
    assert cluster.asked.count("/access/permissions") == 1

    # Pool.Audit on prod taken away: its pool row is no longer listed, and the sight is read again
    cluster.rows = [r for r in ROWS if r["type"] != "pool"]
    cluster.permissions = {"/pool": {"Pool.Audit": 1}, "/pool/prod": {"VM.Audit": 1}}
    assert not pool_known(resolver, 175)
    assert cluster.asked.count("/access/permissions") == 2

    # after pools_ttl, read again
    stale = Cluster(ROWS, EVERY)
    resolver = TargetResolver({"default": stale}, pools_ttl=0.0)  # type: ignore[dict-item]
    assert pool_known(resolver, 175) and pool_known(resolver, 175)
    assert stale.asked.count("/access/permissions") == 2


def test_a_sight_that_cannot_be_read_sees_no_pool_and_is_asked_again() -> None:
    cluster = Cluster(ROWS, RuntimeError("connection reset"))
    resolver = TargetResolver({"default": cluster})  # type: ignore[dict-item]
    assert not pool_known(resolver, 175)
    assert pool_known(resolver, 101)  # a pool the row shows is known all the same
    cluster.permissions = EVERY
    assert pool_known(resolver, 175)  # the failure was not cached
    assert cluster.asked.count("/access/permissions") == 2
