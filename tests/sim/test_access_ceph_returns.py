"""The simulator's identity and Ceph answers have the shapes PVE's own schema declares for them
(`returns` of each endpoint, PVE 8.4 and 9.1): no field PVE does not send where the schema is
closed, every field it always sends present, and the declared JSON types."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.sim.harness import SimHandle, start_simulator
from gateway.sim.schema import Schema

READS = [
    "/access/users", "/access/users/ops@pve", "/access/users/ops@pve/token", "/access/users/root@pam/token/pvegate",
    "/access/groups", "/access/groups/operators", "/access/roles", "/access/roles/PVEAuditor", "/access/acl",
    "/access/domains", "/access/tfa", "/access/tfa/ops@pve",
    "/cluster/ceph/status", "/cluster/ceph/flags", "/cluster/ceph/flags/noout", "/nodes/edge1/ceph/osd",
    "/nodes/edge1/ceph/osd/1/metadata", "/nodes/edge1/ceph/pool", "/nodes/edge1/ceph/pool/vm/status",
    "/nodes/edge1/ceph/mon", "/nodes/edge1/ceph/mgr", "/nodes/edge1/ceph/mds", "/nodes/edge1/ceph/fs",
    "/nodes/edge1/ceph/rules",
]  # fmt: skip
TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (int, bool), "array": (list,),
    "object": (dict,), "null": (type(None),),
}  # fmt: skip


@pytest.fixture(scope="module", params=["8.4.1", "9.1.1"])
def sim(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    """The `second` scenario (it has Ceph) plus the small one's identity objects, on each PVE major."""
    import yaml

    from gateway.sim.scenario import scenario_path

    raw = yaml.safe_load(scenario_path("second").read_text())
    small = yaml.safe_load(scenario_path("small").read_text())
    raw["cluster"]["version"] = request.param
    raw.update({k: small[k] for k in ("users", "groups", "tfa")})
    path = tmp_path_factory.mktemp("returns") / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    h = start_simulator(str(path), tmp_path_factory.mktemp("sim-returns"), ssh=False)
    h.info["version"] = request.param
    yield h
    h.stop()


def problems(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    kind = schema.get("type")
    if isinstance(kind, str) and kind in TYPES and not isinstance(value, TYPES[kind]):
        return [f"{where}: {type(value).__name__} where the schema says {kind}"]
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict) and schema["properties"]:
        props = schema["properties"]
        dynamic = [k for k in props if k.startswith("{")]  # e.g. metadata's {id}
        if schema.get("additionalProperties", 1) == 0 and not dynamic:  # a closed object
            out += [f"{where}: {k} is not in the schema" for k in value if k not in props]
        for k, sub in props.items():
            if k in value:
                out += problems(value[k], sub, f"{where}.{k}")
            elif not sub.get("optional") and not dynamic and "default" not in sub:
                out.append(f"{where}: {k} is missing")
    return out


def test_answers_match_the_schema(sim: SimHandle) -> None:
    schema = Schema.load(None, int(sim.info["version"].split(".")[0]))  # literal path segments match first
    ctx = ssl.create_default_context(cafile=str(sim.ca_file))
    found: list[str] = []
    with httpx.Client(verify=ctx, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"}) as http:
        for path in READS:
            r = http.get(sim.api_url + path)
            assert r.status_code == 200, (path, r.text)
            ep, _, _ = schema.match("GET", path)
            assert ep is not None, path
            found += problems(r.json()["data"], ep.info.get("returns") or {}, path)
    assert found == [], "\n".join(found)
