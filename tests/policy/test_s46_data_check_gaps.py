"""Policy data mistakes the data check missed, and a critical call the data could score below critical.

A network in data.ip_scope that the data's JSON Schema admits but OPA cannot read: the schema's
pattern for `cidr` takes any 1-3 digits per octet, so `10.10.01.240/28` (a leading zero) or
`10.10.300.0/24` pass it; OPA's net.cidr_contains fails on both, so such a network holds no
address: a reserved range written so reserved nothing (the DHCP pool's addresses were answered
about again) and `pvegate policy check` said OK. The data check now names it, and every call is
refused until it is fixed.

A critical risk threshold above 100: the score is clamped to 0-100, so no call was critical any
more, and the data's critical_calls (a node reboot, a firewall turned off), worth the threshold,
waited for a high risk's single approver instead of two. The data check now names it.

A critical call on a guest whose tag the data scores below zero: valid data, yet the call scored
under the critical threshold and was "high". It is critical whatever else it scores now.
The real OPA, through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy.opa_sidecar import find_opa
from gateway.tools.catalog import Catalog

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "policies" / "data" / "data.yaml"
GOLDEN = REPO / "policies" / "golden" / "auditor_reads_token_permissions.json"
REBOOT = REPO / "policies" / "golden" / "maintainer_node_reboot_needs_four_eyes.json"
THRESHOLDS = "level_thresholds: {medium: 25, high: 50, critical: 75}"
DHCP_POOL = "{cidr: 10.10.1.240/28, reason: DHCP pool}"


def _ip_call(tmp_path: Path, ip: str) -> Path:
    """An auditor asking check_ip_availability about `ip` (a golden input with the tool swapped)."""
    doc: dict[str, Any] = next(iter(json.loads(GOLDEN.read_text()).values()))["input"]
    views = {t["name"]: t for t in Catalog.load(REPO / "connectors").policy_views}
    doc["tool"], doc["arguments"] = views["check_ip_availability"], {"ip": ip}
    path = tmp_path / "call.json"
    path.write_text(json.dumps(doc))
    return path


def test_unreadable_reserved_network_is_a_data_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    find_opa()
    text = DATA.read_text()
    assert DHCP_POOL in text
    data = tmp_path / "data.yaml"
    data.write_text(text.replace(DHCP_POOL, "{cidr: 10.10.01.240/28, reason: DHCP pool}"))
    call = _ip_call(tmp_path, "10.10.1.245")

    # the shipped data reserves the address
    assert main(["policy", "explain", "--input", str(call)]) == 0
    assert "address 10.10.1.245 is in the reserved range 10.10.1.240/28" in capsys.readouterr().out

    # the typo is caught by the check ...
    assert main(["policy", "check", "--data", str(data), "--json"]) == 1
    report = json.dumps(json.loads(capsys.readouterr().out))
    assert "ip_scope.reserved.1.cidr: 10.10.01.240/28 is not a network OPA can read" in report

    # ... and the call is refused for the data, never allowed as if the range were not reserved
    main(["policy", "explain", "--input", str(call), "--data", str(data)])
    out = capsys.readouterr().out
    assert not out.startswith("decision: ALLOW"), out
    assert "ip_scope.reserved.1.cidr" in out


def test_critical_threshold_above_the_highest_score_is_a_data_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    find_opa()
    text = DATA.read_text()
    assert THRESHOLDS in text
    data = tmp_path / "data.yaml"
    data.write_text(text.replace(THRESHOLDS, "level_thresholds: {medium: 25, high: 50, critical: 101}"))
    call = tmp_path / "reboot.json"
    call.write_text(json.dumps(next(iter(json.loads(REBOOT.read_text()).values()))["input"]))

    assert main(["policy", "check", "--data", str(data), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    expected = "risk.level_thresholds.critical 101 is above 100, the highest risk score"
    assert any(p.startswith(expected) for p in report["policy_problems"])

    # the reboot is refused for the data, not left to one approver at risk high
    main(["policy", "explain", "--input", str(call), "--data", str(data)])
    out = capsys.readouterr().out
    assert out.startswith("decision: DENY"), out
    assert "risk.level_thresholds.critical 101" in out


FIREWALL_OFF = REPO / "policies" / "golden" / "network_admin_turns_guest_firewall_off.json"
TAG_POINTS = "target_tag_points: {prod: 20, critical: 25}"


def test_critical_call_stays_critical_whatever_else_it_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """risk.critical_calls are "critical whatever their score" (the data's schema): a firewall
    turned off on a guest whose tag the data scores below zero scored 65 and went to one approver
    at risk high. Valid data (points below zero are allowed: the dry run's are), a real OPA."""
    find_opa()
    text = DATA.read_text()
    assert TAG_POINTS in text
    data = tmp_path / "data.yaml"
    data.write_text(text.replace(TAG_POINTS, "target_tag_points: {prod: 20, critical: 25, lab: -30}"))
    doc: dict[str, Any] = next(iter(json.loads(FIREWALL_OFF.read_text()).values()))["input"]
    doc["target"]["tags"] = ["web", "lab"]
    call = tmp_path / "call.json"
    call.write_text(json.dumps(doc))

    assert main(["policy", "check", "--data", str(data)]) == 0
    capsys.readouterr()
    assert main(["policy", "explain", "--input", str(call), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("decision: PENDING APPROVAL (risk critical"), out
    assert "critical_call:firewall-off" in out and "target_tag:lab -30" in out


def test_call_without_arguments_is_refused_and_optimized_agrees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A call input without `arguments` (the contract requires them) was decided as if no argument
    mattered: the admin's guest firewall turned off, critical by its `enable: false` and waiting for
    two approvers, was ALLOWED. It is an input the policy cannot decide (input.invalid), in the plain
    policy and in the partially evaluated one the sidecar loads alike."""
    opa = find_opa()
    doc: dict[str, Any] = next(iter(json.loads(FIREWALL_OFF.read_text()).values()))["input"]
    assert doc["arguments"] == {"vmid": 100, "enable": False}
    variants: dict[str, Any] = {"as recorded": doc}
    for name, value in (("absent", None), ("null", "null"), ("string", "enable=0"), ("array", [])):
        variant = json.loads(json.dumps(doc))
        if value is None:
            del variant["arguments"]
        else:
            variant["arguments"] = None if value == "null" else value
        variants[name] = variant
    call = tmp_path / "call.json"
    call.write_text(json.dumps(variants["absent"]))
    main(["policy", "explain", "--input", str(call)])
    out = capsys.readouterr().out
    assert out.startswith("decision: DENY"), out
    assert "input.arguments must be an object" in out

    from tests.policy import test_optimized as differential

    plain = differential._compare(
        opa, REPO / "policies", tmp_path, {"decisions": variants, "listings": {}, "approvers": {}}
    )
    assert plain["decisions"]["as recorded"]["approval"]["required"] is True
    for name in ("absent", "null", "string", "array"):
        d = plain["decisions"][name]
        assert d["allow"] is False and {r["code"] for r in d["deny_reasons"]} == {"input.invalid"}, (name, d)
