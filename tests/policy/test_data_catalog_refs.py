"""The policy data's tool, tool tag and argument names, checked against the gateway's tool catalog.

A misspelled exact tool name or argument in the data (`node_rebot` in risk.critical_calls) matched
no call, so its control silently stopped applying: the golden reboot case went from "PENDING
APPROVAL (risk critical)" to "ALLOW (risk medium)", and `pvegate policy check` said OK. The check
runs the real OPA (data.pvegate.config.catalog_problems) with the catalog of connectors/.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from gateway.policy.catalog_refs import CONNECTORS_ENV, catalog_problems
from gateway.policy.decisions import DecisionClient
from gateway.policy.opa_sidecar import OPASidecar, client_token
from gateway.store.replay import start_short_lived
from gateway.tools.catalog import Catalog

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "policies" / "data" / "data.yaml"
CONNECTORS = REPO / "connectors"
REBOOT_CASE = REPO / "policies" / "golden" / "maintainer_node_reboot_needs_four_eyes.json"


def _data(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    doc = yaml.safe_load(DATA.read_text())
    edit(doc)
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _critical(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in doc["risk"]["critical_calls"] if c["name"] == name)


def _check(capsys: pytest.CaptureFixture[str], data: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    rc = main(["policy", "check", "--data", str(data), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def _node_rebot(doc: dict[str, Any]) -> None:
    _critical(doc, "node-power")["tools"] = ["node_rebot", "node_shutdown"]


def test_check_refuses_a_misspelled_critical_tool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _data(tmp_path, _node_rebot)
    # what the typo does: the reboot no longer waits for two approvers
    assert main(["policy", "explain", "--input", str(REBOOT_CASE), "--data", str(data)]) == 0
    assert capsys.readouterr().out.startswith("decision: ALLOW (risk medium")
    assert main(["policy", "check", "--data", str(data)]) == 1
    out = capsys.readouterr().out
    assert "  - risk.critical_calls.4.tools: node_rebot names no tool in the catalog (misspelled?)" in out
    assert out.strip().endswith("FAILED: fix the data before building a bundle")


def test_check_refuses_a_misspelled_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(doc: dict[str, Any]) -> None:
        _critical(doc, "nic-firewall-off")["arguments"] = {"firewal": [False]}
        doc["obligations"]["redact"]["vm_create"] = ["arguments.cipasword"]

    rc, report = _check(capsys, _data(tmp_path, edit))
    assert rc == 1 and report["ok"] is False
    assert report["schema_problems"] == [] and report["policy_problems"] == []  # only the catalog knows
    firewal = [
        f"risk.critical_calls.2.arguments.firewal: tool {t} has no parameter firewal (misspelled?)"
        for t in ("lxc_create", "lxc_nic_set", "vm_create", "vm_nic_set")
    ]
    redact = "obligations.redact.vm_create: arguments.cipasword: tool vm_create has no parameter cipasword"
    redact += " (misspelled?)"
    assert report["catalog_problems"] == sorted([*firewal, redact])


def test_check_accepts_the_shipped_data(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["catalog_problems"] == []
    assert report["connectors"] == str(CONNECTORS)


def test_a_glob_matching_no_tool_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["roles"]["viewer"]["allow"].append({"tools": ["get_vresion*"]})
        doc["obligations"]["redact"]["sdn_ipam*"] = ["items.*.token"]  # sdn_ipams: matched, no problem

    rc, report = _check(capsys, _data(tmp_path, edit))
    assert rc == 1
    glob = "roles.viewer.allow.1.tools: the glob get_vresion* matches no tool in the catalog"
    assert report["catalog_problems"] == [glob]


# the review's reproducers (/tmp/rev_input/data_cases*.py), each accepted before
REPRODUCERS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "approval rule tool",
        lambda d: d["approval"]["rules"][1].__setitem__("tools", ["sdn_aply"]),
        "approval.rules.1.tools: sdn_aply names no tool in the catalog (misspelled?)",
    ),
    (
        "deny rule tool",
        lambda d: d["guardrails"]["deny_rules"].append({"name": "x", "tools": ["vm_strat"], "reason": "r"}),
        "guardrails.deny_rules.2.tools: vm_strat names no tool in the catalog (misspelled?)",
    ),
    (
        "role allow tool",
        lambda d: d["roles"]["viewer"]["allow"].append({"tools": ["get_vresion"]}),
        "roles.viewer.allow.1.tools: get_vresion names no tool in the catalog (misspelled?)",
    ),
    (
        "redact tool",
        lambda d: d["obligations"]["redact"].__setitem__("get_guest_confg", ["config.x"]),
        "obligations.redact: get_guest_confg names no tool in the catalog (misspelled?)",
    ),
    (
        "ip_scope tool",
        lambda d: d["ip_scope"].__setitem__("tools", ["check_ip_availabilty"]),
        "ip_scope.tools: check_ip_availabilty names no tool in the catalog (misspelled?)",
    ),
    (
        "reveal_secrets tool",
        lambda d: d["obligations"]["reveal_secrets"][0].__setitem__("tools", ["token_craete"]),
        "obligations.reveal_secrets.0.tools: token_craete names no tool in the catalog (misspelled?)",
    ),
    (
        "approval rule tool tag",
        lambda d: next(r for r in d["approval"]["rules"] if r["name"] == "agent-credentials").__setitem__(
            "tool_tags", ["credentails"]
        ),
        "approval.rules.3.tool_tags: no tool in the catalog carries the tag credentails (misspelled?)",
    ),
]


@pytest.mark.parametrize(("edit", "problem"), [r[1:] for r in REPRODUCERS], ids=[r[0] for r in REPRODUCERS])
def test_each_misspelled_reference_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Callable[[dict[str, Any]], None], problem: str
) -> None:
    rc, report = _check(capsys, _data(tmp_path, edit))
    assert rc == 1 and report["catalog_problems"] == [problem]


def _connectors_renaming(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of connectors/ whose tool `old` is called `new`."""
    copy = tmp_path / "connectors"
    shutil.copytree(CONNECTORS, copy)
    for f in copy.glob("*.yaml"):
        f.write_text(f.read_text().replace(f"name: {old}\n", f"name: {new}\n"))
    return copy


def test_the_catalog_is_the_connector_directory_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = _connectors_renaming(tmp_path, "sdn_apply", "sdn_commit")
    problems = [
        f"{where}: sdn_apply names no tool in the catalog (misspelled?)"
        for where in ("approval.rules.1.tools", "risk.critical_calls.3.tools")
    ]
    rc, report = _check(capsys, DATA, "--connectors", str(other))
    assert rc == 1 and report["connectors"] == str(other) and report["catalog_problems"] == problems
    monkeypatch.setenv(CONNECTORS_ENV, str(other))  # what `bundle build --connectors` hands its checks
    rc, report = _check(capsys, DATA)
    assert rc == 1 and report["catalog_problems"] == problems
    assert main(["policy", "check", "--connectors", str(tmp_path / "nowhere")]) == 2
    assert "no connector directory" in capsys.readouterr().err


def problems_from_a_sidecar(tree: Path) -> tuple[str, ...] | None:
    """`catalog_problems` as a gateway asks it once per revision, of a managed OPA loading `tree`,
    with the repository's connectors."""
    sidecar = OPASidecar(policies=(tree,))
    start_short_lived(sidecar)
    try:

        async def ask() -> tuple[str, ...] | None:
            client = DecisionClient(sidecar.url, timeout_ms=5000, token=client_token(sidecar))
            try:
                return await catalog_problems(client, Catalog.load(CONNECTORS))
            finally:
                await client.close()

        return asyncio.run(ask())
    finally:
        sidecar.stop()


def test_the_gateway_asks_its_opa_with_its_catalog(tmp_path: Path) -> None:
    """What a gateway asks once per revision (gateway/policy/catalog_refs.py), from the policy as the
    managed OPA loads it (partially evaluated with its data)."""
    tree = tmp_path / "policies"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("golden", "*_test.rego"))
    doc = yaml.safe_load(DATA.read_text())
    _node_rebot(doc)
    (tree / "data" / "data.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    problem = "risk.critical_calls.4.tools: node_rebot names no tool in the catalog (misspelled?)"
    assert problems_from_a_sidecar(tree) == (problem,)
