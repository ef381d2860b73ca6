"""A value a tool's own schema offers for a Proxmox field is one Proxmox accepts.

vm_create offered `ostype` win2022 and win2019, which no PVE release has (its enumeration is
other, wxp, w2k, w2k3, w2k8, wvista, win7, win8, win10, win11, l24, l26, solaris): the gateway
took the call as valid, the policy decided on it and the resource quotas counted it, and only
Proxmox refused it (400). A value offered in a tool's enum must be in the field's enumeration
of at least one PVE release the tool works on (the shipped 8.4 and 9.1 schemas); a value
outside it is refused by the gateway before anything is sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.pve_schema import schema_dir
from gateway.tools.catalog import Catalog
from gateway.tools.pveschema import PveSchema, applies, expansions
from tests.connectors.test_tools_e2e import admin, call, text
from tests.support import GatewayThread


def _schemas() -> list[PveSchema]:
    return [PveSchema.load(p) for p in sorted(schema_dir().glob("pve-*-apidata.json*"))]


def test_every_enum_value_a_tool_offers_is_one_proxmox_accepts() -> None:
    catalog = Catalog.load(REPO_ROOT / "connectors")
    schemas = _schemas()
    assert len(schemas) >= 2, "the shipped 8.4 and 9.1 schemas"
    problems: list[str] = []
    for tool in catalog:
        if tool.connector != "pve_api":
            continue
        props = tool.parameters["properties"]
        sent = {
            f: d for kind in ("query", "body") for f, d in (tool.spec.get(kind) or {}).items() if isinstance(d, str)
        }
        for field, param in sent.items():
            offered = props[param].get("enum")
            if not offered or props[param].get("type") != "string":
                continue
            accepted: set[str] = set()
            described = False
            for schema in (s for s in schemas if applies(tool, s)):
                for method, path, _ in expansions(tool):
                    spec = ((schema.endpoints.get((method, path)) or {}).get("parameters") or {}).get(
                        "properties"
                    ) or {}
                    if isinstance(spec.get(field), dict) and "enum" in spec[field]:
                        described = True
                        accepted |= set(spec[field]["enum"])
            if described and (wrong := sorted(set(offered) - accepted)):
                problems.append(f"{tool.name}: {param} offers {wrong}, which Proxmox's {field} never accepts")
    assert problems == []


@pytest.mark.parametrize("ostype", ["win2022", "win2019"])
async def test_an_ostype_proxmox_does_not_have_is_refused_before_any_request(
    gateway: GatewayThread, env: DevEnv, sim: Any, ostype: str
) -> None:
    sim.clear_logs()
    res = await call(env, admin(env, "s46-enum"), "vm_create", {"node": "pve1", "vmid": 4242, "ostype": ostype})
    assert res.is_error, text(res)
    assert res.meta["pvegate/outcome"] == "invalid", text(res)
    assert "ostype" in text(res)
    assert [r for r in sim.requests_log() if r["method"] != "GET"] == []


async def test_windows_server_is_created_with_the_ostype_proxmox_names_it(
    gateway: GatewayThread, env: DevEnv, sim: Any
) -> None:
    """Windows Server 2022/2025 is PVE's win11 (2016/2019: win10): still offered, and accepted."""
    sim.clear_logs()
    res = await call(env, admin(env, "s46-enum"), "vm_create", {"node": "pve1", "vmid": 4243, "ostype": "win11"})
    assert res.meta["pvegate/outcome"] in ("allowed", "pending_approval"), text(res)
    posted = [r for r in sim.requests_log() if r["method"] == "POST" and r["path"].endswith("/nodes/pve1/qemu")]
    assert all(r["status"] == 200 for r in posted), posted


def test_the_schema_files_are_found() -> None:
    assert all(Path(s.source).exists() for s in _schemas())
