"""The resource facts' sizes come from guests' configurations, never from /cluster/resources'
maxcpu/maxmem/maxdisk: those hold the boot disk only (maxdisk), no swap (a container's maxmem),
and on real Proxmox appear only once pvestatd has sampled a guest (seconds after a create or a
resize). A pool member or a clone source whose config cannot be read or sized is unknown
(null usage; a clone's `final` null): the policy refuses what it cannot check. A fake cluster
answers /cluster/resources and the configs, and records what was asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.targets import TargetResolver

GiB = 1 << 30

NODES = [{"type": "node", "node": "pve1", "maxcpu": 32}, {"type": "node", "node": "pve2"}]  # pve2: no figures yet

VM_500 = {"cores": 2, "sockets": 2, "memory": "4096", "scsi0": "local-lvm:vm-500-disk-0,size=32G",
          "scsi1": "local-lvm:vm-500-disk-1,size=100G", "ide2": "none,media=cdrom",
          "efidisk0": "local-lvm:vm-500-disk-2,size=4M"}  # fmt: skip
CT_502 = {"cores": 2, "memory": 1024, "swap": 2048, "rootfs": "local-lvm:vm-502-disk-0,size=8G",
          "mp0": "local-lvm:vm-502-disk-1,mp=/srv,size=50G", "mp1": "/mnt/host,mp=/host"}  # fmt: skip
CT_503 = {"memory": 512, "rootfs": "local-lvm:vm-503-disk-0,size=4G"}  # no cores: every core of pve1; swap 512


class Cluster:
    """/cluster/resources and the guests' configs; `fail` names guests whose config read fails."""

    def __init__(self, rows: list[dict[str, Any]], configs: dict[int, Any], delay: float = 0.0) -> None:
        self.rows = rows
        self.configs = configs
        self.delay = delay
        self.fail: set[int] = set()
        self.no_pool_audit = False  # a token without Pool.Audit: /pools?poolid= is 403
        self.asked: list[str] = []
        self.in_flight = 0
        self.most = 0

    async def request(self, method: str, path: str, params: dict[str, Any] | None = None, **_: Any) -> Any:
        assert method == "GET", path
        self.asked.append(path)
        if path == "/cluster/resources":
            return self.rows
        if path == "/pools":  # GET /pools?poolid=: the pool's members (PVE lists them from its pool config)
            if self.no_pool_audit:
                raise RuntimeError("403 Permission check failed (/pool/sandbox, Pool.Audit)")
            poolid = (params or {})["poolid"]
            members = [r for r in self.rows if r.get("pool") == poolid]
            return [{"poolid": poolid, "members": members}]
        parts = path.split("/")  # /nodes/{node}/{type}/{vmid}/config
        assert parts[1] == "nodes" and parts[-1] == "config", path
        vmid = int(parts[4])
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if vmid in self.fail:
            raise RuntimeError(f"cannot read {path}")
        return self.configs[vmid]

    def config_reads(self) -> list[str]:
        return [p for p in self.asked if p.endswith("/config")]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


async def facts(catalog: Catalog, cluster: Cluster, name: str, args: dict[str, Any]) -> dict[str, Any]:
    resolver = TargetResolver({"default": cluster})  # type: ignore[dict-item]
    tool = catalog.get(name)
    assert tool is not None
    valid = tool.validate(args)
    target = await resolver.resolve(tool, valid, "default")
    out = await resolver.resources(tool, valid, "default", target)
    assert out is not None
    return out


def fresh_rows() -> list[dict[str, Any]]:
    """Three sandbox guests as /cluster/resources lists them before pvestatd sampled them: no
    maxcpu, maxmem or maxdisk (what the old code counted as 0)."""
    return [
        *NODES,
        {"type": "qemu", "vmid": 500, "node": "pve1", "pool": "sandbox", "status": "stopped"},
        {"type": "lxc", "vmid": 502, "node": "pve1", "pool": "sandbox", "status": "stopped"},
        {"type": "lxc", "vmid": 503, "node": "pve1", "pool": "sandbox", "status": "stopped"},
        {"type": "qemu", "vmid": 600, "node": "pve1", "pool": "prod", "maxcpu": 64, "maxmem": 1 << 40},
    ]


CONFIGS = {500: VM_500, 502: CT_502, 503: CT_503}
VM_CREATE = {"node": "pve1", "vmid": 510, "cores": 1, "memory": 512, "pool": "sandbox"}


async def test_pool_usage_is_summed_from_the_members_configs(catalog: Catalog) -> None:
    cluster = Cluster(fresh_rows(), CONFIGS)
    f = await facts(catalog, cluster, "vm_create", VM_CREATE)
    assert f["pool_usage"] == {
        "guests": 3,
        "cores": 2 * 2 + 2 + 32,  # a VM's cores x sockets; a container without cores: its node's 32
        "memory_mib": 4096 + (1024 + 2048) + (512 + 512),  # a container's swap counts, as in a request
        "disk_gib": 1 + 32 + 100 + 8 + 50 + 4,  # every disk (4 MiB EFI disk rounds the sum up), no CD-ROM or bind mount
    }
    # only the pool's members are read; the other pool's guest is not
    assert sorted(cluster.config_reads()) == [
        "/nodes/pve1/lxc/502/config",
        "/nodes/pve1/lxc/503/config",
        "/nodes/pve1/qemu/500/config",
    ]


async def test_a_member_that_cannot_be_sized_makes_the_usage_unknown(catalog: Catalog) -> None:
    cluster = Cluster(fresh_rows(), CONFIGS)
    cluster.fail = {502}
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None
    # a disk without a recorded size is not a free disk
    cluster = Cluster(fresh_rows(), {**CONFIGS, 500: {**VM_500, "scsi2": "local-lvm:vm-500-disk-3"}})
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None
    # nor is a drive that only a backup leaves out (backup=0): the guest's own disk exists
    cluster = Cluster(fresh_rows(), {**CONFIGS, 500: {**VM_500, "scsi2": "local-lvm:vm-500-disk-3,backup=0"}})
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None
    # a container without cores on a node whose cores are not known yet: not counted as 0
    rows = [*fresh_rows()[:-1], {"type": "lxc", "vmid": 504, "node": "pve2", "pool": "sandbox"}]
    cluster = Cluster(rows, {**CONFIGS, 504: CT_503})
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None
    # an answer that is no config
    cluster = Cluster(fresh_rows(), {**CONFIGS, 503: None})
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None


async def test_a_pool_whose_members_cannot_be_read_is_unknown(catalog: Catalog) -> None:
    """Without Pool.Audit, Proxmox drops `pool` from /cluster/resources' rows and answers 403 to
    GET /pools?poolid=: the pool is not summed from the rows (empty: a usage of 0), it is unknown."""
    rows = [{k: v for k, v in r.items() if k != "pool"} for r in fresh_rows()]
    cluster = Cluster(rows, CONFIGS)
    cluster.no_pool_audit = True
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None


async def test_a_clone_asks_for_its_sources_size(catalog: Catalog) -> None:
    cluster = Cluster(fresh_rows(), CONFIGS)
    f = await facts(catalog, cluster, "guest_clone", {"vmid": 500, "newid": 511, "pool": "sandbox"})
    assert f["requested"] == {"guests": 1, "cores": 4, "memory_mib": 4096, "disk_gib": 133}, f
    assert "final" not in f
    f = await facts(catalog, cluster, "guest_clone", {"vmid": 502, "newid": 512, "pool": "sandbox"})
    assert f["requested"] == {"guests": 1, "cores": 2, "memory_mib": 3072, "disk_gib": 58}, f
    # a container without cores takes every core of the node it lands on
    f = await facts(catalog, cluster, "guest_clone", {"vmid": 503, "newid": 513, "pool": "sandbox"})
    assert f["requested"]["cores"] == 32, f
    # a clone of a guest in no pool, into none: no pool usage to read, only the source's config
    cluster = Cluster(fresh_rows(), {**CONFIGS, 600: VM_500})
    f = await facts(catalog, cluster, "guest_clone", {"vmid": 600, "newid": 514})
    assert f["requested"]["disk_gib"] == 133 and f["pool_usage"] is None, f
    assert cluster.config_reads() == ["/nodes/pve1/qemu/600/config"]


async def test_a_clone_whose_source_cannot_be_sized_is_unknown(catalog: Catalog) -> None:
    cluster = Cluster(fresh_rows(), CONFIGS)
    cluster.fail = {500}
    f = await facts(catalog, cluster, "guest_clone", {"vmid": 500, "newid": 511, "pool": "sandbox"})
    assert f["final"] is None, f  # the policy refuses (quota.resource_facts_missing)
    assert f["pool_usage"] is None  # the source is a member too
    cluster = Cluster(fresh_rows(), CONFIGS)
    f = await facts(catalog, cluster, "guest_clone", {"vmid": 503, "newid": 511, "target_node": "pve2"})
    assert f["final"] is None, f  # a container without cores, onto a node whose cores are unknown


async def test_a_resize_counts_the_current_size_from_the_config(catalog: Catalog) -> None:
    """guest_config_update's growth is over the size the config records (the row's maxcpu and
    maxmem may be missing or stale); the guest's config is read once though it is also a member."""
    cluster = Cluster(fresh_rows(), CONFIGS)
    f = await facts(catalog, cluster, "guest_config_update", {"vmid": 502, "cores": 3, "memory": 2048})
    assert f["final"] == {"cores": 3, "memory_mib": 2048 + 2048}, f
    assert f["requested"] == {"guests": 0, "cores": 1, "memory_mib": 1024, "disk_gib": 0}, f
    assert f["pool_usage"] is not None and f["pool_usage"]["guests"] == 3
    assert cluster.config_reads().count("/nodes/pve1/lxc/502/config") == 1


async def test_member_configs_are_read_concurrently_within_a_bound(catalog: Catalog) -> None:
    rows: list[dict[str, Any]] = [*NODES]
    configs: dict[int, Any] = {}
    for vmid in range(700, 740):
        rows.append({"type": "qemu", "vmid": vmid, "node": "pve1", "pool": "sandbox"})
        configs[vmid] = {"cores": 1, "memory": 256, "scsi0": f"local-lvm:vm-{vmid}-disk-0,size=1G"}
    cluster = Cluster(rows, configs, delay=0.02)
    f = await facts(catalog, cluster, "vm_create", VM_CREATE)
    assert f["pool_usage"] == {"guests": 40, "cores": 40, "memory_mib": 40 * 256, "disk_gib": 40}
    assert len(cluster.config_reads()) == 40
    assert 1 < cluster.most <= 8  # targets.CONFIG_READS
    # one member unreadable among them: the usage is unknown
    cluster = Cluster(rows, configs, delay=0.02)
    cluster.fail = {700}
    assert (await facts(catalog, cluster, "vm_create", VM_CREATE))["pool_usage"] is None
