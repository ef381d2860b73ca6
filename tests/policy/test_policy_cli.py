"""`pvegate policy check` and `pvegate policy explain`, against the real OPA binary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.cli import main

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "policies" / "data" / "data.yaml"
GOLDEN = REPO / "policies" / "golden"


def _bad_data(tmp_path: Path) -> Path:
    """The security engineer's finding: a misspelled key, and window hours as strings."""
    doc = yaml.safe_load(DATA.read_text())
    doc["guardrails"]["protected_tag"] = ["crown-jewel"]
    doc["guardrails"]["maintenance_windows"][1].update(from_hour="22", to_hour="05")
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_check_passes_on_the_example_data(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check"]) == 0
    assert capsys.readouterr().out.strip().endswith("OK")


def test_check_reports_unknown_keys_and_wrong_types_by_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", "--data", str(_bad_data(tmp_path)), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    unknown = "guardrails.protected_tag: unknown key (not in the data schema; misspelled?)"
    hour = "guardrails.maintenance_windows.1.from_hour"
    # JSON Schema in Python, and the policy's own problems from a real opa eval
    for key in ("schema_problems", "policy_problems"):
        assert unknown in report[key], report[key]
        assert any(p.startswith(hour) for p in report[key]), report[key]
    assert not any("%!" in p for p in report["policy_problems"])


def test_check_fails_on_unreadable_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "data.yaml"
    bad.write_text("roles: [unclosed\n")
    assert main(["policy", "check", "--data", str(bad)]) == 1
    assert "cannot read" in capsys.readouterr().out


def test_explain_shows_the_rules_that_fired(capsys: pytest.CaptureFixture[str]) -> None:
    case = GOLDEN / "contractor_may_not_read_node_network.json"
    assert main(["policy", "explain", "--input", str(case), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"]["allow"] is False
    assert [r["code"] for r in out["denials"]] == ["guardrail.deny_rule"]
    assert out["deny_rules_matching"] == ["contractors-no-node-network"]
    assert out["roles_granting"] == ["operator"]  # granted by the role, denied by the rule

    assert main(["policy", "explain", "--input", str(case)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decision: DENY")
    assert "[guardrail.deny_rule]" in text and "data.guardrails.deny_rules[contractors-no-node-network]" in text


def test_explain_names_approval_reasons_and_passes_opa_explain(capsys: pytest.CaptureFixture[str]) -> None:
    case = GOLDEN / "breakglass_delete_outside_window_needs_approval.json"
    assert main(["policy", "explain", "--input", str(case), "--opa-explain", "fails"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decision: PENDING APPROVAL")
    assert "[approval.break_glass]" in text and "[approval.rule]" in text
    assert "--- opa eval --explain=fails data.pvegate.decision ---" in text


def test_explain_with_broken_data_shows_the_data_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = GOLDEN / "admin_delete_in_window_needs_sre_lead.json"
    assert main(["policy", "explain", "--input", str(case), "--data", str(_bad_data(tmp_path)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"]["allow"] is False
    assert "data.invalid" in {r["code"] for r in out["denials"]}
    assert "guardrails.protected_tag: unknown key (not in the data schema; misspelled?)" in out["data_problems"]


def test_check_refuses_a_key_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OPA keeps the last of a key given twice without a word: a second `bindings:` would replace
    every binding of the first in the running policy, and the schema alone sees nothing wrong."""
    text = DATA.read_text()
    twice = tmp_path / "data.yaml"
    twice.write_text(text + "\nbindings: []\n")
    assert main(["policy", "check", "--data", str(twice)]) == 1
    out = capsys.readouterr().out
    assert "bindings: given twice in the same mapping" in out, out
