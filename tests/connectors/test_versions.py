"""Tools that work on some PVE releases only: declaration, `pvegate check` against the matching
schemas, least-privilege from the matching schema. (The gateway's refusal on a cluster of another
release runs live in test_ha_e2e.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.pve_schema import SHIPPED_DIR, schema_file
from gateway.tools.catalog import Catalog, CatalogError
from gateway.tools.pveschema import PveSchema, check_catalog, least_privilege, unmatched_versions
from gateway.tools.tool import parse_release

CONNECTORS = REPO_ROOT / "connectors"


def test_release_bounds() -> None:
    assert parse_release("8.4.1") == (8, 4) and parse_release("9") == (9,)
    with pytest.raises(ValueError):
        parse_release("latest")
    cat = Catalog.load(CONNECTORS)
    tool = cat.get("get_version")
    assert tool is not None and not tool.pve_versions and tool.supports((7, 4))
    nine = tool.__class__(**{**tool.__dict__, "pve_versions": {"min": "9.0"}})
    assert nine.supports((9, 0)) and nine.supports((9, 1)) and not nine.supports((8, 4))
    eight = tool.__class__(**{**tool.__dict__, "pve_versions": {"max": "8"}})
    assert eight.supports((8, 4)) and eight.supports((8, 0)) and not eight.supports((9, 0))
    assert eight.versions_text() == "PVE 8 and earlier" and nine.versions_text() == "PVE 9.0 and later"


def _one_tool(tmp: Path, versions: dict[str, str], path: str = "/cluster/ha/rules") -> Path:
    doc = {
        "tools": [
            {
                "name": "probe_rules",
                "title": "Probe",
                "description": "A probe tool for the version checks of the catalog.",
                "domain": "ha",
                "effect": "read",
                "scope": "cluster",
                "pve_versions": versions,
                "pve_api": {"method": "GET", "path": path},
            }
        ]
    }
    (tmp / "probe.yaml").write_text(yaml.safe_dump(doc))
    return tmp


def test_check_uses_the_matching_schema_only(tmp_path: Path) -> None:
    s84 = PveSchema.load(schema_file("8.4", SHIPPED_DIR))
    s91 = PveSchema.load(schema_file("9.1", SHIPPED_DIR))
    assert (s84.release, s91.release) == ("8.4", "9.1")
    cat = Catalog.load(_one_tool(tmp_path, {"min": "9.0"}))
    assert check_catalog(cat, s91) == [] and check_catalog(cat, s84) == []  # 8.4 lacks /cluster/ha/rules
    assert unmatched_versions(cat, [s84]) != [] and unmatched_versions(cat, [s84, s91]) == []
    # declared for 8 only: checked against 8.4, where the path does not exist, and fails
    wrong = Catalog.load(_one_tool(tmp_path, {"max": "8"}))
    assert any("not in" in p for p in check_catalog(wrong, s84)) and check_catalog(wrong, s91) == []
    # an apidoc.js of unknown release checks every tool
    unknown = PveSchema([], "apidoc.js")
    assert unknown.release is None


def test_min_above_max_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"min 9\.1 is above max 8"):
        Catalog.load(_one_tool(tmp_path, {"min": "9.1", "max": "8"}))


def test_least_privilege_reads_each_tool_from_a_matching_schema() -> None:
    cat = Catalog.load(CONNECTORS)
    s84 = PveSchema.load(schema_file("8.4", SHIPPED_DIR))
    s91 = PveSchema.load(schema_file("9.1", SHIPPED_DIR))
    both = least_privilege(cat, [s84, s91], ("read", "write", "destroy"))
    assert both == least_privilege(cat, s91, ("read", "write", "destroy")) or any(
        t.pve_versions for t in cat
    )  # equal unless a tool works on 8.x only
    for tools in both.values():
        for name in tools:
            t = cat.get(name)
            assert t is not None and (not t.pve_versions or any(t.supports(v) for v in ((8, 4), (9, 1))))


def test_network_and_ha_families_meet_their_floors() -> None:
    """Issue #19's floors for the firewall, SDN and HA families, counted by domain as
    `pvegate tools list` shows them; HA groups are 8.x tools, HA rules 9.x ones."""
    cat = Catalog.load(CONNECTORS)
    count: dict[str, int] = {}
    for t in cat:
        count[t.domain] = count.get(t.domain, 0) + 1
    assert count["firewall"] >= 16 and count["sdn"] >= 10 and count["ha"] >= 9, count
    for t in cat:
        if t.domain == "ha" and ("group" in t.name or "rule" in t.name):
            eight = "group" in t.name
            assert t.supports((8, 4)) is eight and t.supports((9, 1)) is not eight, t.name
        if t.effect != "read":
            assert t.dry_run, t.name


def test_least_privilege_covers_the_ha_groups_and_rules() -> None:
    """Each version-bound tool gets its privilege from the schema of a release it works on."""
    cat = Catalog.load(CONNECTORS)
    s84 = PveSchema.load(schema_file("8.4", SHIPPED_DIR))
    s91 = PveSchema.load(schema_file("9.1", SHIPPED_DIR))
    need = least_privilege(cat, [s84, s91], ("read", "write", "destroy"))
    assert {"ha_group_create", "ha_rule_create", "ha_migrate"} <= set(need["Sys.Console"])
    assert {"sdn_apply", "sdn_zone_create", "sdn_vnet_create"} <= set(need["SDN.Allocate"])
    assert "sdn_vnets" in need["SDN.Audit"] and "sdn_vnets" not in need["SDN.Allocate"]
    assert "firewall_guest_rule_create" in need["VM.Config.Network"]
    only91 = least_privilege(cat, s91, ("read", "write", "destroy"))
    assert "ha_group_create" not in only91["Sys.Console"]  # 8.x only: not read from the 9.1 schema
