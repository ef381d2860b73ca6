"""Where a call puts a guest (target.destination), as the connectors declare it: the facts a
binding's scope must cover beside the target (policies/pvegate/rbac)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.targets import destination, tag_list

SOURCE: dict[str, Any] = {
    "cluster": "default",
    "node": "pve1",
    "vmid": 189,
    "pool": "sandbox",
    "pool_known": True,
    "tags": ["web"],
}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


def where(catalog: Catalog, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    tool = catalog.get(name)
    assert tool is not None and tool.destination, name
    return destination(tool, arguments, SOURCE)


def test_a_clone_lands_where_the_call_says(catalog: Catalog) -> None:
    assert where(catalog, "guest_clone", {"vmid": 189, "newid": 190, "pool": "prod"}) == {
        **SOURCE,
        "vmid": 190,
        "pool": "prod",
    }
    # no pool named: Proxmox puts the clone in none; no node named: the source's
    assert where(catalog, "guest_clone", {"vmid": 189, "newid": 191})["pool"] is None
    assert where(catalog, "guest_clone", {"vmid": 189, "newid": 191})["node"] == "pve1"


def test_a_migration_names_its_node(catalog: Catalog) -> None:
    for name in ("guest_migrate", "ha_migrate", "ha_relocate"):
        assert where(catalog, name, {"vmid": 189, "sid": 189, "target_node": "pve2"}) == {**SOURCE, "node": "pve2"}


def test_an_ha_group_leaves_the_node_to_the_ha_manager(catalog: Catalog) -> None:
    """Putting a guest in an HA group lets the HA manager move it to the group's nodes (or any
    node): its destination node is unknown, which a node-scoped binding does not cover."""
    assert where(catalog, "ha_resource_group_set", {"sid": 189, "group": "anywhere"}) == {**SOURCE, "node": None}


def test_a_hidden_pool_stays_unknown_where_the_call_does_not_name_one(catalog: Catalog) -> None:
    """A guest whose pool Proxmox hides from the token (pool_known false) keeps it hidden where it goes
    (a migration), and a clone that names its pool puts it in a known one."""
    hidden = {**SOURCE, "pool": None, "pool_known": False}
    migrate = catalog.get("guest_migrate")
    clone = catalog.get("guest_clone")
    assert migrate is not None and clone is not None
    assert destination(migrate, {"vmid": 189, "target_node": "pve2"}, hidden)["pool_known"] is False
    assert destination(clone, {"vmid": 189, "newid": 190, "pool": "prod"}, hidden)["pool_known"] is True
    assert destination(clone, {"vmid": 189, "newid": 190}, hidden) == {**hidden, "vmid": 190, "pool_known": True}


def test_tags_as_proxmox_writes_them() -> None:
    assert tag_list("prod;web") == ["prod", "web"]
    assert tag_list("prod,web") == ["prod", "web"]  # older releases
    assert tag_list("") == tag_list(None) == []
