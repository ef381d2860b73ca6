"""Output shaping (gateway/shaping.py): the policy's `redact` paths and an exact `max_items` cut.

Planted in review and not caught before: redaction paths ignored, and the item limit
off by one. Real tool definitions from connectors/, output as Proxmox shapes it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.core.redaction import REDACTED, redact_path
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


def pending_rows() -> list[dict[str, Any]]:
    """GET /nodes/{node}/{type}/{vmid}/pending as Proxmox answers it: one row per key."""
    return [
        {"key": "cores", "value": 2, "pending": 4},
        {"key": "sshkeys", "value": "ssh-ed25519%20AAAAold", "pending": "ssh-ed25519%20AAAAnew"},
        {"key": "cipassword", "value": "hunter2"},
        {"key": "ciuser", "value": "ops", "delete": 1},
    ]


def test_a_name_segment_redacts_the_key_value_row_of_that_key(catalog: Catalog) -> None:
    """The example policy redacts config.sshkeys in the config tools; get_guest_pending's rows
    carried the same setting out (found in review). `items.sshkeys` names the row by its key:
    its values are replaced, the key and the fact of a change stay."""
    tool = catalog.tools["get_guest_pending"]
    doc, _ = shape(tool, pending_rows(), obligations(redact=["items.sshkeys", "items.ciuser", "items.absent"]))
    assert doc["items"] == [
        {"key": "cores", "value": 2, "pending": 4},
        {"key": "sshkeys", "value": REDACTED, "pending": REDACTED},
        {"key": "ciuser", "value": REDACTED, "delete": 1},  # cipassword: the connector drops its row
    ]


def test_row_paths_leave_other_lists_alone() -> None:
    doc: dict[str, Any] = {
        "items": [{"key": "a", "value": {"inner": 1, "other": 2}}, {"name": "a", "value": 3}, "a"],
        "plain": ["a", "b"],
    }
    for path in ("items.a.inner", "plain.a", "items.0.key"):
        redact_path(doc, path.split("."))
    assert doc == {
        "items": [{"key": REDACTED, "value": {"inner": REDACTED, "other": 2}}, {"name": "a", "value": 3}, "a"],
        "plain": ["a", "b"],
    }


@pytest.mark.parametrize("name", ["get_guest_config", "get_guest_stored_config", "get_guest_pending"])
def test_a_containers_entrypoint_and_env_are_never_returned(catalog: Catalog, name: str) -> None:
    """PVE 9.1's OCI containers: `entrypoint` is a command line (secrets in its arguments, as Docker's
    Command), `env` the runtime environment; both are dropped, as a stored key and as a pending row."""
    tool = catalog.tools[name]
    config = {"hostname": "app", "entrypoint": "/app/run --token=S3cret", "env": "API_TOKEN=S3cret"}
    data: Any = (
        [{"key": k, "value": v} for k, v in config.items()] if name == "get_guest_pending" else {"config": config}
    )
    doc, _ = shape(tool, data, obligations())
    assert "S3cret" not in str(doc) and "app" in str(doc)


def test_max_items_written_as_a_whole_float_still_cuts(catalog: Catalog) -> None:
    """JSON's 5.0 passes the contract's integer (draft 2020-12) and OPA passes it through as written (a policy
    data value `max_items: 2.0`): the cut was skipped and every item returned (hunt, stop 49)."""
    tool = catalog.get("list_guests")
    doc, warnings = shape(tool, guests(4), obligations(max_items=2.0))
    assert len(doc["items"]) == 2 and warnings == ["output limited by policy to 2 of 4 items"], (doc, warnings)
