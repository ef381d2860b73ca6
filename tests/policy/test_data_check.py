"""The policy data is checked once per policy revision, apart from the decision, and fails closed.

A real OPA (the gateway's sidecar class) on a copy of policies/: the decision client asks
data.pvegate.data_check when it first sees what OPA loaded, not on every call; a restart
that loads broken data is checked at its first decision, and every call is then refused
with the data's problems (code data.invalid) until the data is fixed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.decisions import DATA_CHECK_PATH, DecisionClient
from gateway.policy.opa_sidecar import OPASidecar, OPAUnavailable, find_opa

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "policies" / "golden"


def _golden(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text())[name]
    return doc


async def _after_restart(client: DecisionClient, doc: dict[str, Any]) -> None:
    """The client's kept-alive connection went with the old process: one call notices."""
    for _ in range(5):
        if not (await client.decide(doc)).failed_closed:
            return
    raise AssertionError("no decision from the restarted OPA")


class CountingClient(DecisionClient):
    """The real client, counting the data checks it sends to OPA."""

    checks = 0

    async def query(self, path: str, input_doc: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if path == DATA_CHECK_PATH:
            self.checks += 1
        return await super().query(path, input_doc)


async def test_data_checked_once_per_revision_and_broken_data_refused(tmp_path: Path) -> None:
    find_opa()
    tree = tmp_path / "policies"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("golden"))
    sidecar = OPASidecar(policies=(tree,))
    sidecar.start(timeout=30.0)
    client = CountingClient(sidecar.url, 5000, local_revision=sidecar.revision_key)
    read = _golden("viewer_reads_guest_config")["input"]
    try:
        for _ in range(5):
            d = await client.decide(read)
            assert d.allow and not d.failed_closed, d
        assert client.checks == 1  # not per decision
        assert client.data_check is not None and client.data_check.valid

        # the same OPA restarted on broken data: the next decision checks again, and refuses
        sidecar.stop()
        data = tree / "data" / "data.yaml"
        data.write_text(data.read_text().replace("  protected_tags:", "  protected_tag:", 1))
        sidecar.start(timeout=30.0)
        await _after_restart(client, read)
        for _ in range(3):
            d = await client.decide(read)
            assert not d.allow and not d.failed_closed
            assert d.deny_codes == ["data.invalid"]
            assert any("guardrails.protected_tag: unknown key" in m for m in d.deny), d.deny
            assert d.risk["level"] == "critical" and d.obligations["dry_run"] is True
        assert client.checks == 2
        assert not client.data_check.valid  # type: ignore[union-attr]

        # a forced re-check (the readiness probe's) after the data is fixed and OPA restarted
        sidecar.stop()
        data.write_text(data.read_text().replace("  protected_tag:", "  protected_tags:", 1))
        sidecar.start(timeout=30.0)
        await _after_restart(client, read)
        assert (await client.decide(read)).allow
        assert client.checks == 3
        check = await client.check_data(client.revision_key(None), force=True)
        assert check.valid and client.checks == 4
    finally:
        await client.close()
        sidecar.stop()


async def test_no_usable_data_check_fails_closed(tmp_path: Path) -> None:
    """A data check that breaks its contract is no answer: the call is refused, failed closed."""
    find_opa()
    tree = tmp_path / "policy"
    tree.mkdir()
    decision = _golden("viewer_reads_guest_config")
    valid = {
        "contract_version": 1,
        "allow": True,
        "deny": [],
        "deny_reasons": [],
        "risk": {"score": 0, "level": "low", "factors": []},
        "approval": {
            "required": False,
            "satisfied": False,
            "approver_groups": [],
            "min_approvals": 0,
            "ttl_seconds": 0,
            "reason": "",
            "reasons": [],
        },
        "obligations": {"dry_run": False, "redact": [], "max_items": 10},
        "quota": None,
    }
    (tree / "p.rego").write_text(
        f'package pvegate\n\ndecision := {json.dumps(valid)}\n\ndata_check := {{"valid": "maybe"}}\n'
    )
    sidecar = OPASidecar(policies=(tree,))
    sidecar.start(timeout=30.0)
    client = DecisionClient(sidecar.url, 5000, local_revision=sidecar.revision_key)
    try:
        d = await client.decide(decision["input"])
        assert d.failed_closed and not d.allow
        assert "policy data check unavailable: data check does not match the contract" in d.deny[0]
    finally:
        await client.close()
        sidecar.stop()


async def test_policy_without_data_check_is_asked_its_decision(tmp_path: Path) -> None:
    """A policy from before the check moved out of the decision (no data_check) checks its data
    itself: its decisions are used as they are."""
    find_opa()
    tree = tmp_path / "policy"
    tree.mkdir()
    (tree / "p.rego").write_text(
        'package pvegate\n\ndecision := {"contract_version": 1, "allow": false, "deny": ["no"], '
        '"deny_reasons": [{"code": "x.y", "rule": "r", "message": "no"}], '
        '"risk": {"score": 0, "level": "low", "factors": []}, '
        '"approval": {"required": false, "satisfied": false, "approver_groups": [], "min_approvals": 0, '
        '"ttl_seconds": 0, "reason": "", "reasons": []}, '
        '"obligations": {"dry_run": false, "redact": [], "max_items": 10}, "quota": null}\n'
    )
    sidecar = OPASidecar(policies=(tree,))
    sidecar.start(timeout=30.0)
    client = DecisionClient(sidecar.url, 5000, local_revision=sidecar.revision_key)
    try:
        d = await client.decide(_golden("viewer_reads_guest_config")["input"])
        assert not d.failed_closed and d.deny == ("no",)
        assert client.data_check is not None and client.data_check.valid
    finally:
        await client.close()
        sidecar.stop()


def test_a_key_given_twice_in_the_data_refuses_the_start(tmp_path: Path) -> None:
    """OPA itself keeps the last `bindings:` without a word (every binding of the first would be
    gone from the running policy): the managed sidecar does not start on such data, and says why."""
    tree = tmp_path / "policies"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("golden"))
    data = tree / "data" / "data.yaml"
    data.write_text(data.read_text() + "\nbindings: []\n")
    sidecar = OPASidecar(policies=(tree,))
    with pytest.raises(OPAUnavailable, match="bindings: given twice in the same mapping"):
        sidecar.start(timeout=30.0)
    assert sidecar.process is None  # refused before OPA was started


def test_a_key_given_twice_in_a_json_data_file_refuses_the_start(tmp_path: Path) -> None:
    tree = tmp_path / "policies"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("golden"))
    (tree / "data" / "extra.json").write_text('{"extra": {"bindings": [1], "bindings": [2]}}')
    sidecar = OPASidecar(policies=(tree,))
    with pytest.raises(OPAUnavailable, match="bindings: given twice in the same object"):
        sidecar.start(timeout=30.0)
    assert sidecar.process is None
