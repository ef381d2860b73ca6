"""Output shaping (gateway/shaping.py): the policy's `redact` paths and an exact `max_items` cut.

Planted in review and not caught before: redaction paths ignored, and the item limit
off by one. Real tool definitions from connectors/, output as Proxmox shapes it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.core.redaction import REDACTED
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog, Tool
from gateway.tools.shaping import shape


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


def guests(n: int) -> list[dict[str, Any]]:
    return [
        {"vmid": 100 + i, "name": f"vm{i}", "node": "pve1", "status": "running", "tags": "prod", "netin": 5}
        for i in range(n)
    ]


def obligations(**kw: Any) -> dict[str, Any]:
    return {"dry_run": False, "redact": [], "max_items": 1000, **kw}


@pytest.mark.parametrize(("count", "limit"), [(5, 5), (6, 5), (5, 4), (1, 0), (0, 0), (3, 1)])
def test_max_items_cuts_to_exactly_the_limit(catalog: Catalog, count: int, limit: int) -> None:
    tool: Tool = catalog.tools["list_guests"]
    doc, warnings = shape(tool, guests(count), obligations(max_items=limit))
    kept = min(count, limit)
    assert [g["vmid"] for g in doc["items"]] == [100 + i for i in range(kept)]  # the first `limit`, in order
    if count > limit:
        assert warnings == [f"output limited by policy to {limit} of {count} items"]
    else:
        assert warnings == []


def test_redact_paths_replace_exactly_what_they_name(catalog: Catalog) -> None:
    tool = catalog.tools["list_guests"]
    data = guests(3)
    doc, _ = shape(tool, copy.deepcopy(data), obligations(redact=["items.*.name", "items.1.tags", "items.9.node"]))
    assert [g["name"] for g in doc["items"]] == [REDACTED] * 3
    assert [g["tags"] for g in doc["items"]] == ["prod", REDACTED, "prod"]
    assert [g["node"] for g in doc["items"]] == ["pve1"] * 3  # an index past the end touches nothing
    assert all(g["vmid"] == 100 + i and g["status"] == "running" for i, g in enumerate(doc["items"]))
    assert all("netin" not in g for g in doc["items"])  # projected to the declared fields first


def test_redaction_applies_to_the_items_that_survive_the_cut(catalog: Catalog) -> None:
    tool = catalog.tools["list_guests"]
    doc, warnings = shape(tool, guests(4), obligations(max_items=2, redact=["items.*.name"]))
    assert [(g["vmid"], g["name"]) for g in doc["items"]] == [(100, REDACTED), (101, REDACTED)]
    assert warnings == ["output limited by policy to 2 of 4 items"]


def test_redact_in_a_single_document_and_a_wildcard_over_object_values(catalog: Catalog) -> None:
    tool = catalog.tools["get_guest_config"]
    config = {"cores": 2, "net0": "virtio=AA:BB,bridge=vmbr0", "description": "db", "cipassword": "hunter2"}
    doc, _ = shape(tool, {"config": config}, obligations(redact=["config.description"]))
    assert doc["config"]["description"] == REDACTED and doc["config"]["cores"] == 2
    assert "cipassword" not in doc["config"]  # the connector's sensitive field is dropped outright
    doc, _ = shape(tool, {"config": dict(config)}, obligations(redact=["config.*"]))
    assert set(doc["config"].values()) == {REDACTED}
