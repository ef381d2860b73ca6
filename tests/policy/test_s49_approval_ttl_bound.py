"""An approval's lifetime in the policy data is bounded (366 days), and the decision's `ttl_seconds` (ten years).

Any integer of at least 1 was taken: a `default_ttl_seconds` past what a date can hold (10**12 s is past
the year 9999) passed `pvegate policy check`, and then every call needing an approval failed where the
gateway writes the request's expiry as a date (OverflowError). The data check now names the setting."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.cli import main

REPO = Path(__file__).resolve().parents[2]
SHIPPED = "ttl_seconds_by_level: {low: 900, medium: 900, high: 900, critical: 600}"


@pytest.mark.parametrize("ttl", [10**12, 31622401])
def test_an_approval_lifetime_past_the_bound_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ttl: int
) -> None:
    tree = tmp_path / "policies"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("golden", "*_test.rego"))
    data = tree / "data" / "data.yaml"
    text = data.read_text()
    assert text.count(SHIPPED) == 1
    data.write_text(text.replace(SHIPPED, SHIPPED.replace("critical: 600", f"critical: {ttl}")))
    assert main(["policy", "check", "--policies", str(tree), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    problems = report["schema_problems"] + report["policy_problems"]
    assert any("ttl_seconds_by_level" in p and "critical" in p for p in problems), report


def test_the_shipped_lifetimes_are_within_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", "--policies", str(REPO / "policies"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema_problems"] == [] and report["policy_problems"] == []
