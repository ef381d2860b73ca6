"""Argument values of risk.critical_calls, checked against the types of the tools' parameters.

`risk.arguments_match` compares a listed value exactly with the call's argument, which the gateway
has validated against the tool's input schema. A value of another type never matches: the
Proxmox-style `firewall: [0]` where vm_nic_set's `firewall` is a JSON boolean passed `pvegate
policy check`, and the critical control it carried (two approvers) silently stopped applying, so
an agent could turn a NIC's firewall off without approval (the golden case
`operator_agent_nic_firewall_off_is_critical` went from PENDING APPROVAL to ALLOW, risk low).
The check runs the real OPA (data.pvegate.config.catalog_problems) with the catalog of connectors/.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policy.catalog_refs import catalog_input
from gateway.tools.catalog import Catalog
from tests.policy.test_data_catalog_refs import problems_from_a_sidecar

REPO = Path(__file__).resolve().parents[2]
CONNECTORS = REPO / "connectors"
NIC_CASE = REPO / "policies" / "golden" / "operator_agent_nic_firewall_off_is_critical.json"
SHIPPED = "arguments: {firewall: [false]}"
PROBLEM = (
    "risk.critical_calls.2.arguments.firewall: 0 (number) matches no call: "
    "the parameter is boolean for lxc_create, lxc_nic_set, vm_create, vm_nic_set"
)


def _policies_with(tmp_path: Path, written: str, **ignore: bool) -> Path:
    """A copy of policies/ whose nic-firewall-off entry lists `written` as an admin would type it."""
    tree = tmp_path / "policies"
    patterns = ("golden", "*_test.rego") if ignore.get("tests") else ()
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns(*patterns))
    data = tree / "data" / "data.yaml"
    text = data.read_text()
    assert text.count(SHIPPED) == 1
    data.write_text(text.replace(SHIPPED, f"arguments: {{firewall: {written}}}"))
    return tree


def test_a_proxmox_style_zero_for_a_boolean_fails_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _policies_with(tmp_path, "[0]")
    data = tree / "data" / "data.yaml"
    # what the value does: the call it meant to make critical goes through without approval
    assert main(["policy", "explain", "--input", str(NIC_CASE), "--data", str(data)]) == 0
    assert capsys.readouterr().out.startswith("decision: ALLOW (risk low")

    assert main(["policy", "check", "--policies", str(tree)]) == 1
    out = capsys.readouterr().out
    assert f"  - {PROBLEM}" in out
    assert out.strip().endswith("FAILED: fix the data before building a bundle")

    assert main(["policy", "check", "--policies", str(tree), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["schema_problems"] == [] and report["policy_problems"] == []  # only the catalog knows
    assert report["catalog_problems"] == [PROBLEM]


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ('["false"]', '"false" (string) matches no call'),
        ("[off]", '"off" (string) matches no call'),
        ("[false, 0]", "0 (number) matches no call"),
    ],
)
def test_each_value_of_another_type_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str, problem: str
) -> None:
    rc = main(["policy", "check", "--policies", str(_policies_with(tmp_path, written)), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert report["catalog_problems"] == [
        f"risk.critical_calls.2.arguments.firewall: {problem}: "
        "the parameter is boolean for lxc_create, lxc_nic_set, vm_create, vm_nic_set"
    ]


def test_the_catalog_input_carries_the_parameter_types() -> None:
    tools = catalog_input(Catalog.load(CONNECTORS))["catalog"]
    assert tools["vm_nic_set"]["parameter_types"]["firewall"] == {"type": "boolean"}
    assert tools["firewall_guest_options_set"]["parameter_types"]["policy_in"] == {
        "type": "string",
        "enum": ["ACCEPT", "REJECT", "DROP"],
    }
    assert "firewall" in tools["vm_nic_set"]["parameters"]  # the names, as older policies read them


def test_the_gateway_reports_it_from_its_opa(tmp_path: Path) -> None:
    """What a gateway asks once per revision, from the policy as the managed OPA loads it."""
    tree = _policies_with(tmp_path, "[0]", tests=True)
    assert problems_from_a_sidecar(tree) == (PROBLEM,)
