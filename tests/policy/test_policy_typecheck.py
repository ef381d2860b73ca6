"""The policy is type-checked against the contract's input schemas (`opa check --schema`).

Every policy package that reads `input` carries a `schemas:` annotation (decision_input,
list_input, approve_input, or their union policy_input for packages serving several entry
points). These tests prove the check passes on the real policies and fails on a misspelled
input field in each kind of package, and that the generated union schema is current.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy.opa_sidecar import find_opa

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
SCHEMAS = REPO / "gateway" / "schemas"


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The JSON Schemas alone: opa check --schema reads every file of the folder it is given, and
    gateway/schemas/ also holds __init__.py and, once Python imported it, __pycache__/*.pyc (as
    scripts/policy-checks.sh does)."""
    out = tmp_path_factory.mktemp("schemas")
    for f in SCHEMAS.glob("*.schema.json"):
        shutil.copy(f, out)
    return out


def _check(policies: Path, schemas: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_opa()), "check", "--strict", "--schema", str(schemas), str(policies)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_policies_type_check_against_the_contract(schemas: Path) -> None:
    done = _check(POLICIES, schemas)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("module", "field", "typo", "ref"),
    [
        ("decision.rego", "input.principal.kind in kinds", "input.principal.knd in kinds", "input.principal.knd"),
        (
            "guardrails/guardrails.rego",
            'input.tool.effect == "destroy"',
            'input.tool.efect == "destroy"',
            "input.tool.efect",
        ),
        ("tools_list.rego", "some i, t in input.tools", "some i, t in input.tols", "input.tols"),
        ("quotas/quotas.rego", "input.usage[counter][window]", "input.usages[counter][window]", "input.usages"),
        ("approver/approver.rego", "candidate := input.approver", "candidate := input.aprover", "input.aprover"),
    ],
    ids=["pvegate", "guardrails", "listing", "quotas", "approver"],
)
def test_misspelled_input_field_fails_the_type_check(
    tmp_path: Path, schemas: Path, module: str, field: str, typo: str, ref: str
) -> None:
    copy = tmp_path / "policies"
    shutil.copytree(POLICIES, copy)
    path = copy / "pvegate" / module
    text = path.read_text()
    assert field in text, f"{module} no longer holds {field!r}: update this test"
    path.write_text(text.replace(field, typo, 1))
    done = _check(copy, schemas)
    assert done.returncode != 0
    assert f"undefined ref: {ref}" in done.stdout + done.stderr, done.stdout + done.stderr


def test_policy_input_union_schema_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "policy-input-schema.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout


def test_input_schemas_are_self_contained_and_agree() -> None:
    """OPA fetches a cross-file $ref over the network: each input schema carries its own $defs,
    and the shared ones must equal decision_input's."""
    base = json.loads((SCHEMAS / "decision_input.schema.json").read_text())["$defs"]
    for name in ("list_input", "approve_input"):
        doc = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        text = json.dumps(doc)
        assert "decision_input.schema.json#" not in text, name
        for key, sub in doc["$defs"].items():
            assert sub == base[key], f"{name}.schema.json $defs/{key} drifted from decision_input's"


def test_policy_data_schema_constant_is_current() -> None:
    """The policy validates its data against data_schema.rego, generated from schema/data.json."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "policy-data-schema.py"), "--check"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OPA": str(find_opa())},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
