"""Ceph end to end on a cluster with Ceph (the `second` scenario: three nodes, six OSDs):
HTTPS -> JWT -> real OPA with the example organisation's policy -> pve_api -> simulator.

Reads show the health detail, the OSD tree, pools and daemons. The writes are high risk
(one approver), an OSD set out critical (two): each is held, approved, run once, and the
simulator's log shows exactly the declared request; its state (and `ceph status`) the effect.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.catalog import Catalog
from tests.approvals.conftest import Api, text
from tests.connectors.test_access_e2e import approved_run
from tests.connectors.test_catalog import CONNECTORS
from tests.support import GatewayThread, free_port

CEPH_READS = {
    "ceph_health_detail", "ceph_osd_tree", "ceph_osd_metadata", "ceph_pool_list", "ceph_pool_status",
    "ceph_mon_list", "ceph_mgr_list", "ceph_mds_list", "ceph_fs_list", "ceph_crush_rules", "ceph_flags_list",
}  # fmt: skip
CEPH_WRITES = {"ceph_osd_in", "ceph_osd_out", "ceph_flag_set"}


@pytest.fixture(scope="module")
def csim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("second", tmp_path_factory.mktemp("csim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def capi(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    env: DevEnv = make_env(tmp_path_factory.mktemp("cgw"), {"default": csim}, port=free_port())
    gw = GatewayThread(env.config).start()
    yield Api(env)
    gw.stop()


async def read(api: Api, name: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await api.call(api.env.token("ceph-reader", ["viewer"]), name, args)
    assert not res.get("isError"), f"{name}: {text(res)}"
    return dict(res["structuredContent"])


def osds(tree: dict[str, Any]) -> dict[int, dict[str, Any]]:
    root = tree["root"]["children"][0]
    return {o["id"]: o for host in root["children"] for o in host["children"]}


async def test_ceph_reads(capi: Api) -> None:
    health = (await read(capi, "ceph_health_detail", {}))["health"]
    assert health["status"] == "HEALTH_WARN"
    assert health["checks"]["OSD_NEARFULL"]["detail"] == [{"message": "1 nearfull osd(s)"}]
    tree = await read(capi, "ceph_osd_tree", {"node": "edge1"})
    assert tree["flags"] == "" and len(osds(tree)) == 6
    assert all(o["status"] == "up" and o["in"] == 1 for o in osds(tree).values())
    assert {o["host"] for o in osds(tree).values()} == {"edge1", "edge2", "edge3"}
    meta = await read(capi, "ceph_osd_metadata", {"node": "edge2", "osdid": 3})
    assert meta["osd"]["hostname"] == "edge2" and meta["devices"][0]["device"] == "block"
    pools = {p["pool_name"]: p for p in (await read(capi, "ceph_pool_list", {"node": "edge1"}))["items"]}
    assert pools["vm"]["size"] == 3 and pools["vm"]["crush_rule_name"] == "replicated_rule"
    vm = await read(capi, "ceph_pool_status", {"node": "edge1", "name": "vm"})
    assert vm["application"] == "rbd" and vm["min_size"] == 2
    mons = (await read(capi, "ceph_mon_list", {"node": "edge3"}))["items"]
    assert [m["name"] for m in mons] == ["edge1", "edge2", "edge3"] and all(m["quorum"] == 1 for m in mons)
    mgrs = (await read(capi, "ceph_mgr_list", {"node": "edge1"}))["items"]
    assert [m["state"] for m in mgrs].count("active") == 1
    mds = (await read(capi, "ceph_mds_list", {"node": "edge1"}))["items"]
    assert {m["state"] for m in mds} == {"up:active", "up:standby"}
    fs = (await read(capi, "ceph_fs_list", {"node": "edge1"}))["items"]
    assert fs == [{"name": "cephfs", "data_pool": "cephfs_data", "metadata_pool": "cephfs_metadata"}]
    assert (await read(capi, "ceph_crush_rules", {"node": "edge1"}))["items"] == [{"name": "replicated_rule"}]
    flags = {f["name"]: f for f in (await read(capi, "ceph_flags_list", {}))["items"]}
    assert len(flags) == 11 and flags["noout"]["value"] == 0 and "marked out" in flags["noout"]["description"]
    missing = await capi.call(capi.env.token("ceph-reader", ["viewer"]), "ceph_pool_status",
                              {"node": "edge1", "name": "nope"})  # fmt: skip
    assert missing["isError"] and "pool 'nope' does not exist" in text(missing)


async def test_flag_and_osd_out_in_with_approvals(capi: Api, csim: Any) -> None:
    put = "/api2/json/cluster/ceph/flags"
    await approved_run(
        capi, csim, "ceph_flag_set", {"flag": "noout", "value": True}, ("PUT", f"{put}/noout", {"value": "1"}),
        approvals=1, level="high",
    )  # fmt: skip
    health = (await read(capi, "ceph_health_detail", {}))["health"]
    assert health["checks"]["OSDMAP_FLAGS"]["summary"]["message"] == "noout flag(s) set"
    assert (await read(capi, "ceph_osd_tree", {"node": "edge2"}))["flags"] == "noout"

    await approved_run(
        capi, csim, "ceph_osd_out", {"node": "edge2", "osdid": 3},
        ("POST", "/api2/json/nodes/edge2/ceph/osd/3/out", {}),
    )  # fmt: skip
    tree = osds(await read(capi, "ceph_osd_tree", {"node": "edge1"}))
    assert tree[3]["in"] == 0 and tree[3]["reweight"] == 0.0 and tree[3]["status"] == "up"
    assert sum(o["in"] for o in tree.values()) == 5

    await approved_run(
        capi, csim, "ceph_osd_in", {"node": "edge2", "osdid": 3}, ("POST", "/api2/json/nodes/edge2/ceph/osd/3/in", {}),
        approvals=1, level="high",
    )  # fmt: skip
    assert osds(await read(capi, "ceph_osd_tree", {"node": "edge1"}))[3]["in"] == 1

    await approved_run(
        capi, csim, "ceph_flag_set", {"flag": "noout", "value": False}, ("PUT", f"{put}/noout", {"value": "0"}),
        approvals=1, level="high",
    )  # fmt: skip
    health = (await read(capi, "ceph_health_detail", {}))["health"]
    assert "OSDMAP_FLAGS" not in health["checks"] and health["status"] == "HEALTH_WARN"  # the nearfull OSD stays


async def test_refusals(capi: Api, csim: Any, sim: Any) -> None:
    # an agent never sets an OSD out (node-scope mutation), whatever it holds; nothing is sent
    csim.clear_logs()
    agent = capi.env.token("ceph-agent", ["operator"], groups=["pve-admins"])
    res = await capi.call(agent, "ceph_osd_out", {"node": "edge1", "osdid": 0})
    assert res["isError"] and "Denied" in text(res)
    assert [e for e in csim.requests_log() if e["method"] != "GET"] == []
    # Proxmox's own answers, from the simulator: an unknown OSD; a cluster without Ceph
    ca = ssl.create_default_context(cafile=str(csim.ca_file))
    r = httpx.post(f"{csim.api_url}/nodes/edge1/ceph/osd/42/out", verify=ca,
                   headers={"Authorization": f"PVEAPIToken={csim.tokens['admin']}"})  # fmt: skip
    assert r.status_code == 500 and r.json()["message"] == "no such OSD '42'\n"
    r = httpx.get(f"{sim.api_url}/nodes/pve1/ceph/osd", verify=ssl.create_default_context(cafile=str(sim.ca_file)),
                  headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"})  # fmt: skip
    assert r.status_code == 500 and "not initialized" in r.json()["message"]


def test_every_ceph_tool_is_here() -> None:
    catalog = Catalog.load(CONNECTORS)
    assert {t.name for t in catalog if t.domain == "ceph"} == CEPH_READS | CEPH_WRITES
    for name in CEPH_WRITES:
        assert catalog.tools[name].effect == "write" and catalog.tools[name].dry_run
    for name in CEPH_READS:
        assert catalog.tools[name].annotations["readOnlyHint"] is True
