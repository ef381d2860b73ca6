"""The simulator's endpoints against the real PVE 8.4 and 9.1 schemas, and the connector catalog."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.sim import api as _api  # noqa: F401  (registers every route)
from gateway.sim.harness import SimHandle, start_simulator
from gateway.sim.routes import ROUTES
from gateway.sim.schema import Schema, default_schema_dir
from gateway.tools.tool import parse_release

from .conftest import api

# implemented endpoints that exist only in the newer schema
ONLY_9 = {
    ("GET", "/nodes/{node}/lxc/{vmid}/migrate"),
    *((m, "/cluster/ha/rules") for m in ("GET", "POST")),
    *((m, "/cluster/ha/rules/{rule}") for m in ("GET", "PUT", "DELETE")),
}
REPO = Path(__file__).resolve().parents[2]


def test_every_route_exists_in_both_schemas() -> None:
    s84 = Schema.load(default_schema_dir(), 8)
    s91 = Schema.load(default_schema_dir(), 9)
    assert len(s84.by_template) >= 600 and len(s91.by_template) >= 640  # the real schemas, whole
    for method, path in ROUTES:
        assert s91.has(method, path), (method, path)
        if (method, path) not in ONLY_9:
            assert s84.has(method, path), (method, path)


def test_validation_uses_schema_types() -> None:
    s = Schema.load(default_schema_dir(), 8)
    ep, params, _ = s.match("POST", "/nodes/pve1/qemu/100/snapshot")
    assert ep is not None and params == {"node": "pve1", "vmid": "100"}
    out = s.validate(ep, {**params, "snapname": "ok_1", "vmstate": "yes"})
    assert out["vmid"] == 100 and out["vmstate"] == 1
    for bad in ({"snapname": "1bad"}, {"snapname": "ok", "vmstate": "maybe"}, {"snapname": "ok", "x": "1"}):
        try:
            s.validate(ep, {**params, **bad})
        except Exception as e:
            assert getattr(e, "errors", None)
        else:
            raise AssertionError(bad)
    ep, params, _ = s.match("PUT", "/nodes/pve1/qemu/100/config")
    assert ep is not None
    assert s.validate(ep, {**params, "net1": "virtio,bridge=vmbr0"})["net1"]  # indexed net[n] properties


def _connector_endpoints(release: tuple[int, ...] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, fixed) of every pve_api tool; with a release, only tools that work on it."""
    found: list[tuple[str, str, dict[str, Any]]] = []

    def fits(versions: dict[str, str]) -> bool:
        low, high = versions.get("min"), versions.get("max")
        if release is None:
            return True
        if low and release[: len(parse_release(low))] < parse_release(low):
            return False
        return not high or release[: len(parse_release(high))] <= parse_release(high)

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            spec = obj.get("pve_api")
            if isinstance(spec, dict) and "path" in spec and fits(obj.get("pve_versions") or {}):
                found.append((str(spec.get("method", "GET")).upper(), str(spec["path"]), dict(spec.get("fixed") or {})))
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    for f in sorted((REPO / "connectors").glob("**/*.yaml")):
        walk(yaml.safe_load(f.read_text()))
    return found


SAMPLE = {"node": "pve1", "storage": "local", "snapname": "pre_upgrade", "upid": None}
GUESTS = {"qemu": 100, "lxc": 200}


@pytest.fixture(scope="module")
def sim91(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    h = start_simulator("second", tmp_path_factory.mktemp("sim-91"), ssh=False)
    yield h
    h.stop()


def test_connector_catalog_is_implemented(simh: SimHandle) -> None:
    """Every endpoint a YAML connector declares must be simulated (never 501), on PVE 8.4 ..."""
    _catalog_implemented(simh)


def test_connector_catalog_is_implemented_on_pve9(sim91: SimHandle) -> None:
    """... and on PVE 9.1 (the tools that work on 9.x: HA rules instead of groups)."""
    _catalog_implemented(sim91)


def _catalog_implemented(simh: SimHandle) -> None:
    a = api(simh)
    release = parse_release(a.data("/version")["release"])
    eps = _connector_endpoints(release)
    assert eps, "no connectors found"
    for method, path, fixed in eps:
        if method != "GET":
            # mutations run against a throw-away simulator in test_tasks; here: a handler must exist
            for kind in ("qemu", "lxc") if "{type}" in path else ("",):
                template = path.replace("{type}", kind)
                assert (method, template) in ROUTES, (method, template)
            continue
        kinds = ["qemu", "lxc"] if "{type}" in path else ["qemu" if "/qemu/" in path else "lxc"]
        for kind in kinds:
            concrete = path.replace("{type}", kind).replace("{vmid}", str(GUESTS[kind]))
            if kind == "lxc" and concrete.endswith("/migrate") and release < (9,):
                continue  # GET lxc migrate is new in 9.1
            concrete = re.sub(r"\{(\w+)\}", lambda m: str(SAMPLE.get(m.group(1)) or m.group(0)), concrete)
            r = a.get(concrete, params={k: v for k, v in fixed.items() if "{" not in str(v)})
            assert r.status_code != 501, (method, path, concrete, r.text)
