"""`pvegate check` checks a pve_api tool's `output.fields` (the projection of Proxmox's answer
the agent gets) against the answer Proxmox's schema documents for the endpoint: a misspelt field
would otherwise silently yield nothing. Fields Proxmox returns undocumented are declared in
`output.undocumented`; fields a reducer adds are declared beside the reducer registry."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.pve_schema import SHIPPED_DIR, schema_file
from gateway.tools.catalog import Catalog, CatalogError
from gateway.tools.pveschema import PveSchema, check_catalog
from gateway.tools.runtimes.reducers import REDUCER_FIELDS, TRANSFORMS

CONNECTORS = REPO_ROOT / "connectors"
NODE = {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,62}$", "maxLength": 63, "required": True}


@pytest.fixture(scope="module", params=["8.4", "9.1"])
def schema(request: pytest.FixtureRequest) -> PveSchema:
    return PveSchema.load(schema_file(request.param, SHIPPED_DIR))


def _catalog(tmp: Path, path: str, output: dict[str, Any], **extra: Any) -> Catalog:
    tool = {
        "name": "probe_out",
        "title": "Probe",
        "description": "A probe tool for the output field check of the catalog.",
        "domain": "cluster",
        "effect": "read",
        "scope": "cluster",
        "params": {"node": NODE} if "{node}" in path else {},
        "output": output,
        "pve_api": {"method": "GET", "path": path, **extra},
    }
    (tmp / "probe.yaml").write_text(yaml.safe_dump({"tools": [tool]}))
    return Catalog.load(tmp)


def test_a_misspelt_output_field_is_reported(tmp_path: Path, schema: PveSchema) -> None:
    cat = _catalog(tmp_path, "/cluster/resources", {"list": True, "fields": ["vmid", "staus", "name"]})
    problems = check_catalog(cat, schema)
    assert len(problems) == 1, problems
    assert problems[0].startswith("probe_out: ")
    assert "'staus'" in problems[0] and "GET /cluster/resources" in problems[0] and schema.source in problems[0]


def test_a_field_documented_for_one_guest_type_passes(tmp_path: Path, schema: PveSchema) -> None:
    """One projection serves both guest types: qmpstatus is a VM's, maxswap a container's."""
    path = "/nodes/{node}/{type}/{vmid}/status/current"
    (tmp_path / "p.yaml").write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "name": "probe_guest",
                        "title": "Probe",
                        "description": "A probe tool for the output field check of the catalog.",
                        "domain": "guest",
                        "effect": "read",
                        "scope": "guest",
                        "params": {"vmid": {"type": "integer", "minimum": 100, "maximum": 999999999, "required": True}},
                        "output": {"fields": ["vmid", "qmpstatus", "maxswap", "maxswapp"]},
                        "pve_api": {"method": "GET", "path": path, "locate": "vmid"},
                    }
                ]
            }
        )
    )
    problems = check_catalog(Catalog.load(tmp_path), schema)
    assert len(problems) == 1 and "'maxswapp'" in problems[0] and "probe_guest" in problems[0], problems


def test_a_declared_undocumented_field_passes(tmp_path: Path, schema: PveSchema) -> None:
    """GET /storage documents only `storage`; it returns each storage's configuration."""
    out: dict[str, Any] = {"list": True, "fields": ["storage", "type", "content"]}
    problems = check_catalog(_catalog(tmp_path, "/storage", out), schema)
    assert {p.split("'")[1] for p in problems} == {"type", "content"}, problems
    out["undocumented"] = ["type", "content"]
    assert check_catalog(_catalog(tmp_path, "/storage", out), schema) == []


def test_undocumented_names_an_output_field(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="undocumented 'typ' is not one of its output fields"):
        _catalog(tmp_path, "/storage", {"list": True, "fields": ["storage", "type"], "undocumented": ["typ"]})


def test_a_reducer_added_field_passes(tmp_path: Path, schema: PveSchema) -> None:
    per_row = {"path": "/nodes/{node}/status", "as": "node_status", "when": {"status": "online"}}
    out: dict[str, Any] = {"list": True, "reducer": "nodes", "fields": ["node", "pve_version", "details_unavailable"]}
    assert check_catalog(_catalog(tmp_path, "/nodes", out, per_row=per_row), schema) == []
    # what the reducer takes out of each row is gone, documented or not
    out["fields"] = ["node", "ssl_fingerprint", "node_status"]
    problems = check_catalog(_catalog(tmp_path, "/nodes", out, per_row=per_row), schema)
    assert {p.split("'")[1] for p in problems} == {"ssl_fingerprint", "node_status"}, problems
    assert all("reducer nodes" in p for p in problems)


def test_a_reducer_building_a_new_answer_passes_only_its_own_fields(tmp_path: Path, schema: PveSchema) -> None:
    out: dict[str, Any] = {"reducer": "node_capacity", "fields": ["node", "cpu", "swap", "kversion"]}
    assert check_catalog(_catalog(tmp_path, "/nodes/{node}/status", out), schema) == []
    out["fields"] = ["node", "cpuinfo"]  # Proxmox documents it, but node_capacity does not pass it through
    problems = check_catalog(_catalog(tmp_path, "/nodes/{node}/status", out), schema)
    assert len(problems) == 1 and "'cpuinfo'" in problems[0] and "reducer node_capacity" in problems[0], problems


def test_fields_the_runtime_adds_pass(tmp_path: Path, schema: PveSchema) -> None:
    """fan_out adds each row's node, per_row its answer (and `<as>_error`), envelope its keys."""
    out: dict[str, Any] = {"list": True, "fields": ["storage", "node"]}
    assert check_catalog(_catalog(tmp_path, "/nodes/{node}/storage", out, fan_out="nodes"), schema) == []
    per_row = {"path": "/nodes/{node}/status", "as": "detail"}
    out = {"list": True, "fields": ["node", "detail", "detail_error"]}
    assert check_catalog(_catalog(tmp_path, "/nodes", out, per_row=per_row), schema) == []
    out = {"fields": ["iface", "changes"]}
    assert check_catalog(_catalog(tmp_path, "/nodes/{node}/network", out, envelope=["changes"]), schema) == []


def test_untyped_returns_are_not_checked(tmp_path: Path, schema: PveSchema) -> None:
    """GET /cluster/ceph/status documents no properties: nothing to check a field against."""
    assert check_catalog(_catalog(tmp_path, "/cluster/ceph/status", {"fields": ["anything"]}), schema) == []


def test_every_reducer_declares_its_fields() -> None:
    assert set(REDUCER_FIELDS) == set(TRANSFORMS)


def test_the_shipped_catalog_passes(schema: PveSchema) -> None:
    assert check_catalog(Catalog.load(CONNECTORS), schema) == []


def test_node_network_iface_projects_no_iface() -> None:
    """PVE's GET /nodes/{node}/network/{iface} answers the interface's parsed stanza, without the
    `iface` key the list (hash_to_array) adds: that field always yielded nothing."""
    tool = Catalog.load(CONNECTORS).get("node_network_iface")
    assert tool is not None and "iface" not in tool.output["fields"]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("sim-outfields"), ssh=False)
    yield handle
    handle.stop()


def test_the_simulator_answers_one_interface_as_pve_does(sim: Any) -> None:
    ctx = ssl.create_default_context(cafile=str(sim.ca_file))
    headers = {"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}
    with httpx.Client(verify=ctx, headers=headers, timeout=10.0) as c:
        one = c.get(sim.api_url + "/nodes/pve1/network/vmbr0").json()["data"]
        rows = c.get(sim.api_url + "/nodes/pve1/network").json()["data"]
    assert one["type"] == "bridge" and "iface" not in one
    assert any(r.get("iface") == "vmbr0" for r in rows)  # the list names each interface
