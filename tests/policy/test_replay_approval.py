"""`pvegate policy replay` sees a candidate that changes the terms of an approval (found in review).

compare() looked at outcome, risk level and obligations only: a candidate that let one approver
decide a critical call instead of two, opened approvals to more groups or let them live longer
replayed as `changed: 0` and passed a gate with every change kind. Where both sides need an
approval (approval.required, no deny) its terms are compared now, each in a kind of its own, and
`approval-weakened` names the weakening ones, so a gate can fail on those alone.

The sample audit is test_replay_gate.py's (the real audit writer, decisions by the real OPA on the
shipped policies); every candidate is asked by a real OPA. The decisions expected to change are
found without the replay code: each recorded input is put to a separately started candidate OPA.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy.opa_sidecar import OPASidecar
from gateway.store.audit import unpack_input
from tests.policy.conftest import decisions
from tests.policy.test_replay_gate import POLICIES, _replay

WEAKENING = ("approvers-fewer", "approver-groups-added", "approval-ttl-longer")
# change kind -> (the line of the shipped data, the candidate's)
EDITS: dict[str, tuple[str, str]] = {
    "approvers-fewer": (
        "min_approvals_by_level: {low: 1, medium: 1, high: 1, critical: 2}",
        "min_approvals_by_level: {low: 1, medium: 1, high: 1, critical: 1}",
    ),
    "approvers-more": (
        "min_approvals_by_level: {low: 1, medium: 1, high: 1, critical: 2}",
        "min_approvals_by_level: {low: 1, medium: 1, high: 1, critical: 3}",
    ),
    "approver-groups-added": (
        "default_approver_groups: [sre-leads, ops-approvers]",
        "default_approver_groups: [sre-leads, ops-approvers, team-web]",
    ),
    "approver-groups-removed": (
        "default_approver_groups: [sre-leads, ops-approvers]",
        "default_approver_groups: [sre-leads]",
    ),
    "approval-ttl-longer": (
        "ttl_seconds_by_level: {low: 900, medium: 900, high: 900, critical: 600}",
        "ttl_seconds_by_level: {low: 900, medium: 900, high: 1800, critical: 600}",
    ),
    "approval-ttl-shorter": (
        "ttl_seconds_by_level: {low: 900, medium: 900, high: 900, critical: 600}",
        "ttl_seconds_by_level: {low: 900, medium: 900, high: 300, critical: 600}",
    ),
}
OUTCOME_KINDS = "allow-to-deny,deny-to-allow,approval-required,approval-waived,risk,obligations"


def _candidate(tmp_path: Path, kind: str) -> Path:
    was, now = EDITS[kind]
    cand = tmp_path / kind
    shutil.copytree(POLICIES, cand)
    data = cand / "data" / "data.yaml"
    text = data.read_text()
    assert text.count(was) == 1, f"the shipped data no longer holds {was!r}"
    data.write_text(text.replace(was, now))
    return cand


def _needs_approval(outcome: str, approval: dict[str, Any]) -> bool:
    return outcome != "deny" and approval.get("required") is True


def _candidate_approvals(audit: Path, cand: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """request_id -> (recorded approval, candidate's approval) for every recorded decision that needs an
    approval and still does under the candidate, asking a separate candidate OPA one input at a time."""
    rows = [r for r in decisions(audit) if '"input_z"' in r["body"]]
    opa = OPASidecar(policies=(cand,))
    opa.start()
    out = {}
    try:
        with opa.client(timeout=30) as c:
            for row in rows:
                body = json.loads(row["body"])
                if not _needs_approval(row["outcome"], body["approval"]):
                    continue
                result = c.post("/v1/data/pvegate/decision", json={"input": unpack_input(body)}).json()["result"]
                if not result["deny"] and result["approval"]["required"] is True:
                    out[row["request_id"]] = (body["approval"], result["approval"])
    finally:
        opa.stop()
    return out


def test_one_approver_instead_of_two_is_reported_and_fails_a_gate(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's candidate: critical calls need one approver instead of two. It replayed as
    `changed: 0` and passed `--fail-on` with every change kind there was."""
    cand = _candidate(tmp_path, "approvers-fewer")
    pairs = _candidate_approvals(audit, cand)
    fewer = {rid for rid, (was, now) in pairs.items() if now["min_approvals"] < was["min_approvals"]}
    assert fewer, "the sample audit holds no held critical call: the test would prove nothing"

    rc, report, _, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(cand), "--fail-on", "approvers-fewer"
    )
    assert rc == 1 and report is not None, err
    assert report["by_kind"] == {"approvers-fewer": len(fewer)} and report["failed"] is True
    assert {c["request_id"] for c in report["changes"]} == fewer
    for c in report["changes"]:
        assert c["kinds"] == ["approvers-fewer"] and c["before"]["outcome"] == c["after"]["outcome"] == "approval"
        assert c["before"]["approval"]["min_approvals"] == 2 and c["after"]["approval"]["min_approvals"] == 1

    # the weakening alias fails too; a gate on tightening only, or on the outcome kinds, passes
    for gate, expect in (("approval-weakened", 1), ("approvers-more", 0), (OUTCOME_KINDS, 0), ("any", 1)):
        rc, report, _, err = _replay(capsys, tmp_path, "--db", str(audit), "--policies", str(cand), "--fail-on", gate)
        assert rc == expect and report is not None, (gate, err)

    # the text report names the kind and shows the terms that moved
    capsys.readouterr()
    assert main(["policy", "replay", "--db", str(audit), "--policies", str(cand), "--fail-on", "approvers-fewer"]) == 1
    out = capsys.readouterr().out
    assert f"changed:   {len(fewer)} (approvers-fewer {len(fewer)})" in out
    assert "approval/critical -> approval/critical (approvers 2 -> 1)" in out
    assert f"gate:      FAILED: {len(fewer)} change(s) of approvers-fewer" in out


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_each_change_of_an_approvals_terms_has_its_kind(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Each edit of the approval data is reported as its kind alone, on the decisions a separate OPA
    shows it moves; `--fail-on approval-weakened` fails on the weakening ones only."""
    cand = _candidate(tmp_path, kind)
    pairs = _candidate_approvals(audit, cand)
    term = {"approvers": "min_approvals", "approver-groups": "approver_groups", "approval-ttl": "ttl_seconds"}
    key = term[kind.rsplit("-", 1)[0]]
    if key == "approver_groups":  # a set: its order is no change
        moved = {rid for rid, (was, now) in pairs.items() if set(was[key]) != set(now[key])}
    else:
        moved = {rid for rid, (was, now) in pairs.items() if was[key] != now[key]}
    assert moved, f"no recorded decision is moved by {EDITS[kind][1]!r}: the test would prove nothing"

    rc, report, _, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(cand), "--fail-on", "approval-weakened"
    )
    assert report is not None, err
    assert report["by_kind"] == {kind: len(moved)}
    assert {c["request_id"] for c in report["changes"]} == moved
    assert rc == (1 if kind in WEAKENING else 0), err
    rc, report, _, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(cand), "--fail-on", "approval-changed"
    )
    assert rc == 1 and report is not None and report["failing"] == len(moved), err


def test_an_unchanged_candidate_reports_no_change_of_approvals(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report, _, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(POLICIES), "--fail-on", "approval-changed"
    )
    assert rc == 0 and report is not None and report["changed"] == 0 and report["replayed"] > 0, err
