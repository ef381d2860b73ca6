"""A property-string entry given only in part is refused, never sent shorter or left out.

A template's optional part without its base (`net0: vlan needs bridge`), a value whose field
name's `{index}` is missing (`ipconfig{index}: ip_cidr needs index`) and an index no given
value uses are refused with a Refused (nothing sent) before the runtime asks Proxmox anything.
A template none of whose values is given is still left out, as before."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import Refused
from gateway.tools.runtimes.pve_api import PveApiRuntime, template_value
from gateway.tools.tool import Tool


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


def parts(catalog: Catalog, name: str, args: dict[str, Any], node: str = "pve2") -> dict[str, Any]:
    """The body the runtime would send for a located guest on `node` (no Proxmox asked)."""
    tool = catalog.get(name)
    assert tool is not None
    args = tool.validate(args)
    rt = PveApiRuntime({}, None)  # type: ignore[arg-type]  # request_parts reads neither
    _, _, body = rt.request_parts(tool, args, {**args, "node": node, "type": "qemu"})
    return body


def refused(catalog: Catalog, name: str, args: dict[str, Any]) -> str:
    tool: Tool | None = catalog.get(name)
    assert tool is not None
    rt = PveApiRuntime({}, None)  # type: ignore[arg-type]
    checked = tool.validate(args)
    with pytest.raises(Refused) as info:  # as the pipeline (and call()) asks it, then builds the request
        rt.check(tool, checked)
        rt.request_parts(tool, checked, {**args, "node": "pve2", "type": "qemu"})
    return str(info.value)


NET0 = ["virtio,bridge={bridge}", ",tag={vlan}", ",firewall={firewall}"]


def test_template_optional_part_without_base_is_refused() -> None:
    with pytest.raises(Refused, match=r"^net0: vlan needs bridge$"):
        template_value("net0", NET0, {"vlan": 20})
    with pytest.raises(Refused, match=r"^net0: vlan, firewall need bridge$"):
        template_value("net0", NET0, {"vlan": 20, "firewall": True})
    with pytest.raises(Refused, match=r"^ipconfig0: gateway needs ip_cidr$"):
        template_value("ipconfig0", ["ip={ip_cidr}", ",gw={gateway}"], {"gateway": "10.0.0.1"})


def test_template_fully_absent_or_whole_is_as_before() -> None:
    assert template_value("net0", NET0, {}) is None
    assert template_value("net0", NET0, {"name": "x"}) is None
    assert template_value("net0", NET0, {"bridge": "vmbr0", "vlan": 20}) == "virtio,bridge=vmbr0,tag=20"
    assert template_value("ide2", ["none,media=cdrom"], {}) == "none,media=cdrom"
    with pytest.raises(Refused, match="disk_storage needs disk_gib as well"):
        template_value("scsi0", ["{disk_storage}:{disk_gib}"], {"disk_storage": "local-lvm"})


def test_cloudinit_ipconfig_without_index_is_refused(catalog: Catalog) -> None:
    # the reviewer's case: ip_cidr and gateway without index were dropped and only ciuser was PUT
    args = {"vmid": 102, "ciuser": "ops", "ip_cidr": "10.10.1.77/24", "gateway": "10.10.1.1"}
    assert refused(catalog, "vm_cloudinit_set", args) == "ipconfig{index}: ip_cidr, gateway need index"
    # index and gateway without ip_cidr: the base is missing
    args = {"vmid": 102, "ciuser": "ops", "index": 0, "gateway": "10.10.1.1"}
    assert refused(catalog, "vm_cloudinit_set", args) == "ipconfig{index}: gateway needs ip_cidr"
    # gateway alone: both the index and the base are named
    args = {"vmid": 102, "gateway": "10.10.1.1"}
    assert refused(catalog, "vm_cloudinit_set", args) == "ipconfig{index}: gateway needs index, ip_cidr"
    # an index nothing uses is not dropped either
    args = {"vmid": 102, "ciuser": "ops", "index": 1}
    assert refused(catalog, "vm_cloudinit_set", args) == "ipconfig{index}: index needs ip_cidr"


def test_cloudinit_whole_or_absent_ipconfig_is_sent_as_before(catalog: Catalog) -> None:
    assert parts(catalog, "vm_cloudinit_set", {"vmid": 102, "ciuser": "ops"}) == {"ciuser": "ops"}
    body = parts(
        catalog, "vm_cloudinit_set", {"vmid": 102, "index": 1, "ip_cidr": "10.0.0.5/24", "gateway": "10.0.0.1"}
    )
    assert body == {"ipconfig1": "ip=10.0.0.5/24,gw=10.0.0.1"}


def test_create_nic_without_bridge_is_refused(catalog: Catalog) -> None:
    assert refused(catalog, "vm_create", {"node": "pve2", "vmid": 778, "vlan": 20}) == "net0: vlan needs bridge"
    args = {"node": "pve2", "vmid": 779, "cloudinit_storage": "local-lvm", "gateway": "10.10.1.1"}
    assert refused(catalog, "vm_create", args) == "ipconfig0: gateway needs ip_cidr"
    args = {
        "node": "pve2",
        "vmid": 780,
        "template_storage": "local",
        "template": "debian-12-standard_12.7-1_amd64.tar.zst",
        "disk_storage": "local-lvm",
        "disk_gib": 4,
        "vlan": 30,
        "ip_cidr": "10.10.2.80/24",
    }
    assert refused(catalog, "lxc_create", args) == "net0: ip_cidr, vlan need bridge"
    # firewall defaults to true (filled in by validate): only a value the caller chose asks for a NIC
    assert (
        refused(catalog, "vm_create", {"node": "pve2", "vmid": 778, "firewall": False}) == "net0: firewall needs bridge"
    )


def test_create_without_nic_is_as_before(catalog: Catalog) -> None:
    body = parts(catalog, "vm_create", {"node": "pve2", "vmid": 778})
    assert "net0" not in body and "ipconfig0" not in body
    body = parts(catalog, "vm_create", {"node": "pve2", "vmid": 778, "bridge": "vmbr0", "vlan": 20})
    assert body["net0"].startswith("virtio,bridge=vmbr0,tag=20")


def test_create_dry_run_without_pool_has_no_placeholder(catalog: Catalog) -> None:
    """The reviewer's case: lxc_create's dry run read "... in pool {pool} when given." without a pool."""
    calls = {
        "vm_create": {"node": "pve2", "vmid": 778},
        "lxc_create": {"node": "pve1", "vmid": 555, "template_storage": "local", "disk_storage": "local-lvm",
                       "template": "debian-12-standard_12.7-1_amd64.tar.zst", "disk_gib": 4},
    }  # fmt: skip
    rt = PveApiRuntime({}, None)  # type: ignore[arg-type]
    for name, args in calls.items():
        tool = catalog.get(name)
        assert tool is not None
        for given in (args, {**args, "pool": "sandbox"}):
            values = tool.validate(given)
            path, query, body = rt.request_parts(tool, values, values)
            impact = rt._dry_run(tool, values, path, query, body)["expected_impact"]
            assert "{" not in impact and "pool" in impact, impact
