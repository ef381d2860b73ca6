"""`pvegate policy explain` printed a decision the gateway would not make, or a traceback.

explain showed the policy's raw answer: one outside the decision contract (an extra key) printed
ALLOW where the gateway denies with policy.unavailable, a policy tree without
`data.pvegate.checked_decision` (older than it; the gateway asks `data.pvegate.decision`) ended in
a KeyError traceback, and a tree with a link to nothing crashed `policy check` with shutil's
traceback (and explain blamed the input). explain now reads the decision and the data check as the
decision client does, and a tree that cannot be copied is a clear error, exit 2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policy.opa_sidecar import REPO_ROOT

ALLOWED = REPO_ROOT / "policies" / "golden" / "admin_adds_dev_guest_to_ha.json"  # allowed by the shipped policy


def _tree(tmp_path: Path, old: str, new: str) -> Path:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    rego = tree / "pvegate" / "decision.rego"
    text = rego.read_text()
    assert old in text
    rego.write_text(text.replace(old, new))
    return tree


def _explain(tree: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["policy", "explain", "--policies", str(tree), "-i", str(ALLOWED), "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)["decision"]
    assert isinstance(decision, dict)
    return decision


def test_an_answer_outside_the_contract_is_explained_as_the_gateway_denies_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path, '\t"quota": quotas.result,\n} if {', '\t"quota": quotas.result,\n\t"note": "x",\n} if {')
    d = _explain(tree, capsys)
    assert d["allow"] is False and d["failed_closed"] is True
    assert [r["code"] for r in d["deny_reasons"]] == ["policy.unavailable"]  # type: ignore[attr-defined]
    assert main(["policy", "explain", "--policies", str(tree), "-i", str(ALLOWED)]) == 0
    assert capsys.readouterr().out.startswith("decision: DENY")


def test_a_policy_without_checked_decision_is_explained_as_the_gateway_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _tree(tmp_path, "checked_decision := data_refusal if {\n\tcount(data_denials) > 0\n} else := decision\n", "")
    assert _explain(tree, capsys)["allow"] is True
    assert _explain(REPO_ROOT / "policies", capsys)["allow"] is True  # the shipped policy: as before


@pytest.mark.parametrize("command", ["check", "explain"])
def test_a_tree_that_cannot_be_copied_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    (tree / "pvegate" / "gone.rego").symlink_to(tmp_path / "nothing")
    extra = ["-i", str(ALLOWED)] if command == "explain" else []
    assert main(["policy", command, "--policies", str(tree), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot copy the policy tree {tree}: {tree / 'pvegate' / 'gone.rego'}")
    assert "Traceback" not in err and "input" not in err
