"""Whose volume a call names (target.volume_of): the owner a Proxmox volume id says it has, as
the storage plugins' parse_volname reads it, and that guest as the cluster knows it now. What
the name says is a guest's but cannot be checked stays unknown (`exists: null`): the policy
refuses to destroy it."""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.targets import TargetResolver, volume_owner

OWNERS: list[tuple[str, tuple[str, int | None] | None]] = [
    # disk images on block storages (lvm, lvmthin, zfs, rbd), whatever their role
    ("local-lvm:vm-101-disk-0", ("images", 101)),
    ("local-lvm:vm-101-disk-1", ("images", 101)),  # an EFI or TPM state disk is one too
    ("local-lvm:vm-101-efidisk0", ("images", 101)),
    ("local-lvm:vm-101-tpmstate0", ("images", 101)),
    ("local-lvm:vm-101-cloudinit", ("images", 101)),
    ("local-lvm:vm-101-state-pre_upgrade", ("images", 101)),
    ("local-lvm:base-9000-disk-0", ("images", 9000)),  # a template's base image
    ("local-zfs:subvol-200-disk-0", ("images", 200)),
    ("local-btrfs:basevol-200-disk-0", ("images", 200)),
    ("local-lvm:base-9000-disk-0/vm-151-disk-0", ("images", 151)),  # a linked clone's: the clone's
    # directory storages: the owner's directory
    ("local:101/vm-101-disk-0.qcow2", ("images", 101)),
    ("local:101/vm-101-cloudinit.qcow2", ("images", 101)),
    ("local:9000/base-9000-disk-0.qcow2/151/vm-151-disk-0.qcow2", ("images", 151)),
    ("local:200/subvol-200-disk-0.subvol", ("images", 200)),
    ("local:rootdir/200", ("images", 200)),
    # backups: vzdump archives and PBS snapshots (namespaced too)
    ("local:backup/vzdump-qemu-101-2026_11_20-01_00_00.vma.zst", ("backup", 101)),
    ("local:backup/vzdump-lxc-200-2026_11_20-01_00_00.tar.zst", ("backup", 200)),
    ("pbs:backup/vm/101/2026-11-20T01:00:00Z", ("backup", 101)),
    ("pbs:backup/ns/prod/ct/200/2026-11-20T01:00:00Z", ("backup", 200)),
    # a guest's disk, but whose cannot be told: unknown, never nobody's
    ("local:101/vm-102-disk-0.qcow2", ("images", None)),
    ("local-lvm:vm-101-disk-0/vm-102-disk-0", ("images", None)),
    ("local-zfs:vm-101-disk-0/x", ("images", None)),
    # nobody's: ISOs, templates, snippets, imports, a backup without an id, a LUN
    ("local:iso/debian-12.7.0-amd64-netinst.iso", None),
    ("local:iso/vm-101-disk-0.iso", None),
    ("local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst", None),
    ("local:snippets/user-data.yaml", None),
    ("local:import/appliance.ova", None),
    ("local:backup/manual-copy.tar", None),
    ("iscsi:0.0.1.scsi-36001405a1b2c3d4e5f60718293a4b5c6", None),
    ("no-storage-prefix", None),
]


@pytest.mark.parametrize(("volume", "owner"), OWNERS, ids=[v for v, _ in OWNERS])
def test_the_owner_a_volume_name_says(volume: str, owner: tuple[str, int | None] | None) -> None:
    assert volume_owner(volume) == owner


class Cluster:
    """/cluster/resources as a client answers it, or a failure."""

    def __init__(self, rows: list[dict[str, Any]] | None) -> None:
        self.rows = rows
        self.asked = 0

    async def request(self, method: str, path: str, params: dict[str, str] | None = None, **_: Any) -> Any:
        if (method, path) == ("GET", "/cluster/nextid"):  # PVE: the id when no guest has it, else an error
            assert params is not None and self.rows is not None
            if any(str(r.get("vmid")) == params["vmid"] for r in self.rows):
                raise RuntimeError(f"VM {params['vmid']} already exists")
            return int(params["vmid"])
        assert (method, path) == ("GET", "/cluster/resources")
        self.asked += 1
        if self.rows is None:
            raise RuntimeError("connection reset")
        return self.rows


ROWS = [
    {"type": "node", "node": "pve1", "status": "online"},
    {"type": "qemu", "vmid": 101, "node": "pve1", "tags": "prod;protected", "pool": "prod"},
]


@cache
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


def owner_of(rows: list[dict[str, Any]] | None, volume: str, name: str = "storage_volume_delete") -> dict[str, Any]:
    tool = catalog().get(name)
    assert tool is not None and tool.target.get("volume_of") == "volume", name
    cluster = Cluster(rows)
    resolver = TargetResolver({"default": cluster}, ttl=3600)  # type: ignore[dict-item]
    args = {"node": "pve1", "storage": volume.split(":")[0], "volume": volume}
    target = asyncio.run(resolver.resolve(tool, args, "default"))
    return dict(target["volume_of"])


def test_an_existing_guests_volume() -> None:
    assert owner_of(ROWS, "local-lvm:vm-101-disk-0") == {
        "cluster": "default",
        "volume": "local-lvm:vm-101-disk-0",
        "content": "images",
        "vmid": 101,
        "node": "pve1",
        "pool": "prod",
        "pool_known": True,  # the row names it
        "tags": ["prod", "protected"],
        "exists": True,
    }
    backup = owner_of(ROWS, "pbs:backup/vm/101/2026-11-20T01:00:00Z", "storage_volume_set")
    assert (backup["content"], backup["vmid"], backup["exists"]) == ("backup", 101, True)
    assert backup["tags"] == ["prod", "protected"]


def test_an_orphan_and_a_volume_of_nobody() -> None:
    orphan = owner_of(ROWS, "local-lvm:vm-777-disk-0")
    assert (orphan["content"], orphan["vmid"], orphan["exists"], orphan["tags"]) == ("images", 777, False, [])
    iso = owner_of(ROWS, "local:iso/debian.iso")
    assert (iso["content"], iso["vmid"], iso["exists"]) == (None, None, None)


def test_what_cannot_be_checked_stays_unknown() -> None:
    # the lookup fails (the target's own lookup fails first: unknown facts, not a refusal here)
    failed = owner_of(None, "local-lvm:vm-101-disk-0")
    assert (failed["content"], failed["vmid"], failed["exists"], failed["tags"]) == ("images", 101, None, [])
    # the name does not say whose disk it is: not looked up, unknown
    unclear = owner_of(ROWS, "local:101/vm-102-disk-0.qcow2")
    assert (unclear["content"], unclear["vmid"], unclear["exists"]) == ("images", None, None)


def test_the_lookup_is_fresh() -> None:
    """A guest tagged protected a moment ago counts: the owner is read afresh, not from the cache."""
    tool = catalog().get("storage_volume_delete")
    assert tool is not None
    cluster = Cluster([dict(r) for r in ROWS])
    resolver = TargetResolver({"default": cluster}, ttl=3600)  # type: ignore[dict-item]
    args = {"node": "pve1", "storage": "local-lvm", "volume": "local-lvm:vm-101-disk-0"}

    async def twice() -> list[dict[str, Any]]:
        first = await resolver.resolve(tool, args, "default")
        cluster.rows[1]["tags"] = "prod"  # type: ignore[index]
        second = await resolver.resolve(tool, args, "default")
        return [first["volume_of"], second["volume_of"]]

    first, second = asyncio.run(twice())
    assert first["tags"] == ["prod", "protected"] and second["tags"] == ["prod"]
