"""A parameter's schema holds JSON Schema keywords only.

An unquoted description with a comma in a `{...}` flow mapping (`description: Bridge or SDN vnet, e.g.
vmbr0.`) is split by YAML at the comma: the description is cut short and a key `e.g. vmbr0.` joins the
parameter's schema. The metaschema lets it pass (unknown keywords are annotations), so fourteen shipped
parameters carried such keys to every client's tools/list. The loader now refuses a key that is no keyword."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import SCHEMA_KEYWORDS, Catalog, CatalogError

CONNECTORS = REPO_ROOT / "connectors"


def test_a_description_split_at_its_comma_is_refused(tmp_path: Path) -> None:
    text = (CONNECTORS / "provision.yaml").read_text()
    quoted = 'description: "Bridge or SDN vnet, e.g. vmbr0."'
    assert quoted in text
    (tmp_path / "provision.yaml").write_text(text.replace(quoted, "description: Bridge or SDN vnet, e.g. vmbr0.", 1))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    with pytest.raises(
        CatalogError, match=r"parameter bridge has keys that are no JSON Schema keyword: e\.g\. vmbr0\."
    ):
        Catalog.load(tmp_path)


def test_the_shipped_parameters_hold_keywords_only() -> None:
    catalog = Catalog.load(CONNECTORS)
    for tool in catalog:
        for name, schema in tool.parameters["properties"].items():
            assert set(schema) <= SCHEMA_KEYWORDS, (tool.name, name, sorted(set(schema) - SCHEMA_KEYWORDS))
    bridge = catalog.get("vm_nic_set").parameters["properties"]["bridge"]
    assert bridge["description"] == "Bridge or SDN vnet, e.g. vmbr0.", json.dumps(bridge)


def _one_tool(tmp_path: Path, schema: str) -> None:
    (tmp_path / "t.yaml").write_text(
        "tools:\n"
        "  - name: s49_probe\n"
        "    title: A probe\n"
        "    effect: read\n"
        "    domain: cluster\n"
        "    scope: cluster\n"
        "    description: A probe of the connector loader, naming one parameter of its own to check.\n"
        "    pve_api: {method: GET, path: /version}\n"
        f"    params:\n      opts: {schema}\n"
    )


def test_an_annotation_of_ones_own_is_x_and_nested_schemas_are_checked(tmp_path: Path) -> None:
    _one_tool(tmp_path, '{type: string, maxLength: 8, x-note: "ours"}')
    assert Catalog.load(tmp_path).get("s49_probe") is not None
    _one_tool(tmp_path, "{type: array, maxItems: 2, items: {type: string, maxLength: 4, nullable: true}}")
    with pytest.raises(CatalogError, match="parameter opts has keys that are no JSON Schema keyword: nullable"):
        Catalog.load(tmp_path)
