"""What a least-privilege token sees on Proxmox, and what the gateway decides on it, end to end:
MCP client -> HTTPS -> JWT -> real OPA -> gateway -> simulator.

Pools. PVE's GET /cluster/resources deletes a guest row's `pool` unless the token has Pool.Audit
on /pool/<pool> (API2/Cluster.pm), and GET /pools?poolid= answers 403 without it. A gateway whose
token lacks Pool.Audit must not sum a pool from /cluster/resources (it would find it empty: a
usage of 0, every max_pool_total passed): the pool's usage is unknown and a pool limit refuses.
With the role `pvegate tools least-privilege` prints (which holds Pool.Audit), the quota counts
the pool as before. One gateway, two clusters on the same simulator: `default` with the printed
role, `nopool` with that role less Pool.Audit.

Tags. Proxmox splits a guest's tags on `;`, `,` and whitespace, and compares them without case
by default; a config written by an older release or by hand reaches /cluster/resources as
written (`prod Protected`). The protected-tag guardrail must see `protected` in it.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.core.config import load
from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.pve_schema import SHIPPED_DIR, schema_file
from gateway.tools.catalog import Catalog
from gateway.tools.pveschema import PveSchema, least_privilege, role_privileges
from gateway.tools.targets import tag_list
from tests.approvals.conftest import Api, outcome, text
from tests.support import GENEROUS_QUOTAS, GatewayThread, example_policy, free_port, mutations

ALWAYS = [
    {"name": "always", "weekdays": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "from_hour": 0, "to_hour": 24}
]


def printed_role() -> list[str]:
    """The privileges of the role `pvegate tools least-privilege` prints by default."""
    catalog = Catalog.load(REPO_ROOT / "connectors")
    schemas = [PveSchema.load(schema_file(v, SHIPPED_DIR)) for v in ("8.4", "9.1")]
    return role_privileges(least_privilege(catalog, schemas, ("read", "write", "destroy")))


def scenario(path: Path) -> Path:
    """The small scenario, plus: a guest in pool sandbox, a guest whose tags a hand-written config
    holds as `prod Protected`, and two tokens of a user with every privilege: one with the
    printed least-privilege role, one with that role less Pool.Audit."""
    data = yaml.safe_load((REPO_ROOT / "gateway" / "sim" / "scenarios" / "small.yaml").read_text())
    data["guests"] += [
        {"vmid": 170, "type": "qemu", "node": "pve1", "name": "sandbox-1", "status": "stopped", "pool": "sandbox",
         "cores": 1, "memory_mb": 512, "disk_gb": 4},
        {"vmid": 160, "type": "qemu", "node": "pve1", "name": "old-db", "status": "stopped",
         "tags": "prod Protected", "cores": 1, "memory_mb": 512, "disk_gb": 4},
    ]  # fmt: skip
    role = printed_role()
    data["roles"]["PVEGateLP"] = role
    data["roles"]["PVEGateNoPool"] = [p for p in role if p != "Pool.Audit"]
    data["users"].append({"userid": "gwlp@pve", "acls": [{"path": "/", "roles": ["Administrator"]}]})
    data["tokens"] += [
        {"name": "lp", "tokenid": "gwlp@pve!lp", "privsep": True, "acls": [{"path": "/", "roles": ["PVEGateLP"]}]},
        {"name": "lp-nopool", "tokenid": "gwlp@pve!nopool", "privsep": True,
         "acls": [{"path": "/", "roles": ["PVEGateNoPool"]}]},
    ]  # fmt: skip
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def vsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    tmp = tmp_path_factory.mktemp("vis-sim")
    handle = start_simulator(str(scenario(tmp / "scenario.yaml")), tmp, ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def vapi(vsim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("vis-gw")

    def edit(data: dict[str, Any]) -> None:
        data["quotas"] = GENEROUS_QUOTAS
        data["guardrails"]["maintenance_windows"] = ALWAYS
        for q in data["resource_quotas"]:
            if q["name"] == "provisioners-in-sandbox":
                q["max_pool_total"] = {"guests": 2}

    opa = example_policy(tmp / "policy", edit)
    env = make_env(tmp / "gw", {"default": vsim, "nopool": vsim}, port=free_port(), opa=opa)
    secrets = env.workdir / "secrets"  # each cluster's token file (devenv.cluster_entry): the admin's, replaced
    (secrets / "default-pve-token").write_text(vsim.tokens["lp"] + "\n")
    (secrets / "nopool-pve-token").write_text(vsim.tokens["lp-nopool"] + "\n")
    env.config = load(env.config_path)
    gw = GatewayThread(env.config).start()
    yield Api(env)
    gw.stop()


def pve(sim: Any, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=sim.api_url,
        verify=ssl.create_default_context(cafile=str(sim.ca_file)),
        headers={"Authorization": f"PVEAPIToken={sim.tokens[token]}"},
        timeout=10,
    )


def test_printed_role_holds_pool_audit() -> None:
    role = printed_role()
    assert "Pool.Audit" in role and "VM.Audit" in role
    # also for a gateway serving only destroy tools, none of which needs either
    catalog = Catalog.load(REPO_ROOT / "connectors")
    schema = PveSchema.load(schema_file("9.1", SHIPPED_DIR))
    assert {"Pool.Audit", "VM.Audit"} <= set(role_privileges(least_privilege(catalog, schema, ("destroy",))))


def test_a_guests_pool_is_shown_only_with_pool_audit(vsim: Any) -> None:
    with pve(vsim, "lp-nopool") as c:
        rows = c.get("/cluster/resources").json()["data"]
        guests = {r["vmid"]: r for r in rows if r["type"] in ("qemu", "lxc")}
        assert {100, 170} <= set(guests)  # VM.Audit: the rows are listed
        assert all("pool" not in r for r in guests.values()), guests
        assert not any(r["type"] == "pool" for r in rows)
        r = c.get("/pools", params={"poolid": "sandbox"})
        assert r.status_code == 403 and "Pool.Audit" in r.json()["message"], r.text
    with pve(vsim, "lp") as c:
        rows = c.get("/cluster/resources").json()["data"]
        assert {r["vmid"]: r.get("pool") for r in rows if r.get("vmid") in (100, 170)} == {100: "prod", 170: "sandbox"}
        members = c.get("/pools", params={"poolid": "sandbox"}).json()["data"][0]["members"]
        assert [m["vmid"] for m in members] == [170]


async def test_a_pool_limit_is_refused_when_the_pool_cannot_be_read(vapi: Api, vsim: Any) -> None:
    """Pool sandbox holds one guest, its limit is two: a token without Pool.Audit sees no member
    of it in /cluster/resources, and a gateway summing those would allow any number of creates."""
    agent = vapi.env.token("vis-provisioner", ["provisioner"], kind="agent")
    create = {"node": "pve1", "pool": "sandbox", "cores": 1, "memory": 256}

    vsim.clear_logs()
    res = await vapi.call(agent, "vm_create", {**create, "vmid": 171, "cluster": "nopool"})
    assert outcome(res) == "denied", res
    assert "quota.resource_pool_unknown" in res["structuredContent"]["codes"], text(res)
    assert "the usage of pool sandbox could not be read" in text(res), text(res)
    assert mutations(vsim) == []

    # the printed role: the quota counts the pool's guest, the create fits, the next one does not
    res = await vapi.call(agent, "vm_create", {**create, "vmid": 171})
    assert outcome(res) == "allowed" and not res.get("isError"), text(res)
    assert vsim.state()["guests"]["171"]["pool"] == "sandbox"
    vsim.clear_logs()
    res = await vapi.call(agent, "vm_create", {**create, "vmid": 172})
    assert outcome(res) == "denied", res
    assert "quota.resource_pool_total" in res["structuredContent"]["codes"], text(res)
    assert "pool sandbox holds 2 guests" in text(res), text(res)
    assert mutations(vsim) == []


def test_tags_split_as_proxmox_splits_them() -> None:
    assert tag_list("prod Protected") == ["prod", "protected"]
    assert tag_list(" web,DB;;prod  web ") == ["web", "db", "prod"]
    assert tag_list(None) == [] and tag_list("") == []


def test_the_simulator_keeps_a_raw_tag_list_and_normalises_one_set_through_the_api(vsim: Any) -> None:
    with pve(vsim, "admin") as c:
        row = next(r for r in c.get("/cluster/resources").json()["data"] if r.get("vmid") == 160)
        assert row["tags"] == "prod Protected"  # as the hand-written config holds it
        assert c.put("/nodes/pve1/qemu/170/config", data={"tags": "Web;Protected,dev web"}).status_code == 200
        assert c.get("/nodes/pve1/qemu/170/config").json()["data"]["tags"] == "dev;protected;web"
        row = next(r for r in c.get("/cluster/resources").json()["data"] if r.get("vmid") == 170)
        assert row["tags"] == "dev;protected;web"


async def test_a_hand_written_protected_tag_is_never_destroyed(vapi: Api, vsim: Any) -> None:
    admin = vapi.human("vis-dana", ["pve-admins"])
    vsim.clear_logs()
    res = await vapi.call(admin, "guest_delete", {"vmid": 160})
    assert outcome(res) == "denied" and 'tagged "protected"' in text(res), res
    assert "approval" not in res["structuredContent"]  # a plain deny: no approval is offered
    assert mutations(vsim) == []
