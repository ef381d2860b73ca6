"""`pvegate policy eval` takes a golden-case file as it is and prints OPA's real decision."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "eval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


@pytest.mark.parametrize("case", ["agent_may_not_migrate", "agent_stops_prod_guest_needs_approval"])
def test_a_golden_case_file_is_decided_as_its_expectation_says(case: str) -> None:
    path = ROOT / "policies" / "golden" / f"{case}.json"
    expect = json.loads(path.read_text())[case]["expect"]
    done = _eval("--input", str(path))
    assert done.returncode == 0, done.stderr
    decision = json.loads(done.stdout)
    assert decision["allow"] is expect["allow"]
    assert not decision["failed_closed"]
    for fragment in expect.get("deny_contains", []):
        assert any(fragment in reason for reason in decision["deny"]), (fragment, decision["deny"])
    assert not any("contract_version" in reason for reason in decision["deny"])


def test_the_bare_input_and_stdin_work_too(tmp_path: Path) -> None:
    case = json.loads((ROOT / "policies" / "golden" / "agent_may_not_migrate.json").read_text())
    bare = case["agent_may_not_migrate"]["input"]
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "eval", "--input", "-"],
        input=json.dumps(bare),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["allow"] is False


def test_a_verification_key_without_a_bundle_is_a_usage_error(tmp_path: Path) -> None:
    """A policy directory carries no signature: the key must not be silently ignored."""
    key = tmp_path / "bundle-verify.pem"
    key.write_text("not even read\n")
    case = ROOT / "policies" / "golden" / "agent_may_not_migrate.json"
    done = _eval("--input", str(case), "--verification-key", str(key))
    assert done.returncode == 2 and not done.stdout
    assert "error: --verification-key needs --bundle" in done.stderr and "usage:" in done.stderr
    assert "Traceback" not in done.stderr
