"""A composite read guests its policy input never named.

check_ip_availability reads every guest's stored config (get_guest_stored_config) and every running
VM's guest agent (vm_agent_network), but pvegate.rbac decided a composite's leaves on the composite's
own target: the cluster. A binding scoped to pool prod that denies those leaves never held on a
cluster target, so a caller refused `get_guest_stored_config` on guest 107 directly learned through the
composite which address guest 107 is configured with ("configured on guest 107 (vault)"), against
docs/policy-contract.md: a composite is no way around what the caller may call directly. The connector
now declares the leaves a composite calls beyond its target (`fans_out`), and the policy decides those
with no scope to test: any deny of the leaf the caller is bound to denies the composite, and the
listing hides it. Real simulator, real OPA, the gateway over HTTPS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.tools.catalog import Catalog, CatalogError
from tests.support import GatewayThread, example_env


@pytest.fixture(scope="module")
def dsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("default", tmp_path_factory.mktemp("dsim"))
    yield handle
    handle.stop()


def fence(data: dict[str, Any]) -> None:
    data["ip_scope"]["permitted_networks"].append({"cidr": "10.20.1.0/24", "name": "prod"})
    data["roles"]["no-prod-config"] = {
        "description": "may not read prod guests' configuration",
        "deny": [{"tools": ["get_guest_stored_config", "vm_agent_network"]}],
    }
    data["bindings"].append(
        {"name": "fence-prod", "role": "no-prod-config", "token_roles": ["fenced"], "scope": {"pools": ["prod"]}}
    )


@pytest.fixture(scope="module")
def fenv(dsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return example_env(Path(tmp_path_factory.mktemp("fenv")), dsim, fence)


@pytest.fixture(scope="module")
def fgw(fenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(fenv.config).start()
    yield gw
    gw.stop()


async def call(env: DevEnv, name: str, args: dict[str, Any]) -> Any:
    async with mcp_client(env.url, env.token("fenced-viewer", ["viewer", "fenced"]), env.ca_file) as client:
        return await client.call_tool(name, args)


async def test_a_composite_does_not_read_a_guest_whose_leaf_is_denied(fgw: GatewayThread, fenv: DevEnv) -> None:
    direct = await call(fenv, "get_guest_stored_config", {"vmid": 107})
    assert direct.is_error and "no-prod-config" in direct.content[0].text  # the fence holds for the leaf
    comp = await call(fenv, "check_ip_availability", {"ip": "10.20.1.107"})
    evidence = (comp.structured_content or {}).get("evidence") or []
    # denied outright, or the fenced guest's config and agent never read: either way nothing about 107
    assert comp.is_error or not any("guest 107" in e or "VM 107" in e for e in evidence), evidence
    assert comp.is_error and "every guest and node of cluster" in comp.content[0].text, comp
    assert "no-prod-config" in comp.content[0].text


async def test_the_listing_hides_the_composite_and_keeps_the_rest(fgw: GatewayThread, fenv: DevEnv) -> None:
    async with mcp_client(fenv.url, fenv.token("fenced-viewer", ["viewer", "fenced"]), fenv.ca_file) as client:
        fenced = {t.name for t in (await client.list_tools()).tools}
    async with mcp_client(fenv.url, fenv.token("plain-viewer", ["viewer"]), fenv.ca_file) as client:
        plain = {t.name for t in (await client.list_tools()).tools}
    assert "check_ip_availability" in plain and "check_ip_availability" not in fenced
    assert "get_guest_stored_config" in fenced  # callable outside pool prod: still listed
    assert plain - fenced == {"check_ip_availability"}, plain - fenced


def test_fans_out_names_only_leaves_of_uses(tmp_path: Path) -> None:
    """A leaf named in fans_out but not in uses would be decided on the target alone: refused at load."""
    connectors = Path(__file__).resolve().parents[2] / "connectors"
    doc = yaml.safe_load((connectors / "composite.yaml").read_text())
    ip = next(t for t in doc["tools"] if t["name"] == "check_ip_availability")
    ip["composite"]["fans_out"] = ["get_guest_stored_config", "get_guest_status"]
    for f in connectors.glob("*.yaml"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "composite.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(CatalogError, match="fans_out names get_guest_status, not in its uses"):
        Catalog.load(tmp_path)
    views = Catalog.load(connectors).policy_views
    fanning = {t["name"]: t["fans_out"] for t in views if "fans_out" in t}
    assert fanning == {
        "check_ip_availability": ["get_guest_stored_config", "vm_agent_network", "node_arp_table", "node_ping"],
        "list_backups": ["list_storage_content"],
    }
