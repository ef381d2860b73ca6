"""What `pvegate policy replay` replays and what it does not, and the records it cannot read (found in
review): approver votes, tools/list and the console's sections were never asked and no report said
so; export lines with a `ts` that is no number vanished uncounted; a deeply nested input or body was a
RecursionError traceback (exit 1, "gate failed"). Also `policy eval --entrypoint visible_tools|approver`
answering what the gateway would not act on, `policy check --data` on a deeply nested file, `policy
explain --data` on a missing file, and a signed candidate bundle compiled before it was verified.

A sample audit is written by the real audit writer (bench/replay_audit.py, decisions by the real OPA
on the shipped policies); every candidate is asked by a real OPA.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.replay import (
    Candidate,
    Filters,
    ReplayError,
    Report,
    ServerEngine,
    expand_kinds,
    read_audit,
    replay,
)
from tests.policy.conftest import export_rows

POLICIES = REPO_ROOT / "policies"
DEEP = 50_000  # far past what Python's json (and the YAML loader) can nest


def _replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str, fmt: str = "json") -> tuple[int, str, str]:
    out = tmp_path / f"report.{fmt}"
    out.unlink(missing_ok=True)
    capsys.readouterr()
    rc = main(["policy", "replay", *args, "--format", fmt, "-o", str(out)])
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stdout + stderr
    return rc, out.read_text() if out.exists() else "", stderr


def _tree(tmp_path: Path, name: str) -> Path:
    tree = tmp_path / name
    shutil.copytree(POLICIES, tree, ignore=shutil.ignore_patterns("*_test.rego", "golden"))
    return tree


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


# --- defect 1: the report's scope, and the questions it cannot replay -------------------------------------


def test_every_report_format_states_what_was_and_was_not_replayed(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--db", str(audit), "--policies", str(POLICIES), "--engine", "eval", "--fail-on", "any"]
    rc, text, err = _replay(capsys, tmp_path, *args)
    assert rc == 0, err
    scope = json.loads(text)["scope"]
    assert scope["replayed"] == ["tools/call decisions (data.pvegate.decision)"]
    assert [s.split(" (")[0] for s in scope["not_replayed"]] == ["approver votes", "tool listings", "console sections"]
    assert scope["compared_with_baseline"] is False and scope["baseline"] is None
    for fmt in ("text", "markdown"):
        rc, text, err = _replay(capsys, tmp_path, *args, fmt=fmt)
        assert rc == 0, err
        assert "NOT replayed" in text and "data.pvegate.approver.decision" in text, text
        assert "data.pvegate.visible_tools" in text and "data.pvegate.console.sections" in text
        assert "not compared with a baseline" in text  # a passing gate says what it did not check
        assert "NOT checked (no baseline)" in text


def _baseline_replay(audit: Path, candidate: Path, gate: str = "any") -> Report:
    report = Report("candidate", "audit", Filters(), fail_on=tuple(sorted(expand_kinds([gate]))))
    with Candidate(policies=(candidate,)).staged() as run, ServerEngine(run) as engine:
        records = read_audit(audit, Filters(), report.skipped)
        replay(records, engine, report, baseline=Candidate(policies=(POLICIES,)))
    return report


def test_a_candidate_without_four_eyes_fails_against_the_baseline(audit: Path, tmp_path: Path) -> None:
    """Removing the self-approval and humans-only guards and listing every tool changes no recorded
    decision: the replay said `changed: 0`, `gate: passed`."""
    cand = _tree(tmp_path, "no-four-eyes")
    approver = cand / "pvegate" / "approver" / "approver.rego"
    _edit(approver, "\tcandidate.sub == pending.requester\n", "\tfalse\n")
    _edit(approver, '\tnot candidate.kind == "human"\n', "\tfalse\n")
    _edit(cand / "pvegate" / "tools_list.rego", "\tsome i in listed\n", "\tsome i\n\tinput.tools[i]\n")
    report = _baseline_replay(audit, cand)
    assert report.replayed > 0 and not report.changes  # no recorded decision moves
    kinds = report.unreplayed.by_kind()
    assert kinds.get("approver-changed") and kinds.get("listing-changed"), kinds
    assert report.failed and report.failing == len(report.unreplayed.changes)
    # the requester voting on its own request: refused for four-eyes before, not now
    selfish = [
        c
        for c in report.unreplayed.changes
        if c["entrypoint"] == "approver" and "approver.self_approval" in c["before"]["codes"]
    ]
    assert selfish and all("approver.self_approval" not in c["after"]["codes"] for c in selfish)
    doc = report.as_json()
    assert doc["scope"]["compared_with_baseline"] is True and doc["unreplayed_changes"]
    text = report.as_text()
    assert "answered differently from the baseline" in text and "gate:      FAILED" in text
    # a gate on the decision kinds alone does not fail on them (but the report still shows them)
    assert not _baseline_replay(audit, cand, "deny-to-allow").failed


def test_a_data_change_letting_viewers_approve_fails_against_the_baseline(audit: Path, tmp_path: Path) -> None:
    cand = _tree(tmp_path, "viewers-approve")
    _edit(
        cand / "data" / "data.yaml",
        "  ops-approvers:\n    members: [alice, bob]\n",
        "  ops-approvers:\n    members: [alice, bob]\n    token_roles: [viewer]\n",
    )
    report = _baseline_replay(audit, cand)
    assert not report.changes and report.unreplayed.by_kind().get("approver-changed"), report.as_text()
    assert report.failed


def test_the_command_line_compares_with_the_baseline_it_is_given(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--baseline-policies`: the gate fails on a candidate without four-eyes, exit 1, as the library does."""
    cand = _tree(tmp_path, "no-four-eyes-cli")
    _edit(cand / "pvegate" / "approver" / "approver.rego", "\tcandidate.sub == pending.requester\n", "\tfalse\n")
    args = ["--db", str(audit), "--policies", str(cand), "--engine", "eval", "--fail-on", "any"]
    rc, text, err = _replay(capsys, tmp_path, *args, "--baseline-policies", str(POLICIES))
    assert rc == 1, err
    doc = json.loads(text)
    assert doc["scope"]["compared_with_baseline"] is True
    assert any(c["kind"] == "approver-changed" for c in doc["unreplayed_changes"]), doc["unreplayed_changes"]
    rc, text, err = _replay(capsys, tmp_path, *args)  # the same without a baseline: passes, and says so
    assert rc == 0 and json.loads(text)["scope"]["compared_with_baseline"] is False, err


def test_the_baseline_itself_changes_nothing(audit: Path) -> None:
    report = _baseline_replay(audit, POLICIES)
    assert not report.failed and not report.unreplayed.changes
    assert all(report.unreplayed.inputs[e] > 0 for e in ("approver", "visible_tools", "console"))


# --- defect 2: an export line whose ts is no number -------------------------------------------------------


def test_export_lines_with_a_bad_ts_are_counted_garbled(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = export_rows(audit)
    lines[0]["ts"] = str(lines[0]["ts"])
    lines[1]["ts"] = "yesterday"
    del lines[2]["ts"]
    lines[3]["ts"] = None
    export = tmp_path / "decisions.jsonl"
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["--export", str(export), "--policies", str(POLICIES), "--engine", "eval", "--fail-on", "deny-to-allow"]
    rc, text, err = _replay(capsys, tmp_path, *args)
    report = json.loads(text)
    assert rc == 0, err
    assert report["skipped"]["garbled"] == 4 and report["replayed"] == len(lines) - 4
    rc, text, _ = _replay(capsys, tmp_path, *args, fmt="text")
    assert "warning: 4 decision record(s) have a garbled input or body" in text


# --- defect 3: deeply nested records and data -------------------------------------------------------------


def _packed(doc_text: str) -> str:
    return base64.b64encode(zlib.compress(doc_text.encode())).decode()


def test_deeply_nested_inputs_and_bodies_are_garbled_not_tracebacks(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = export_rows(audit)
    lines[0]["body"]["input_z"] = _packed('{"x":' + "[" * DEEP + "]" * DEEP + "}")  # the kept input
    lines[1]["body"] = '{"x":' + "[" * DEEP + "]" * DEEP + "}"  # the body as a string
    export = tmp_path / "deep.jsonl"
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rc, text, err = _replay(capsys, tmp_path, "--export", str(export), "--policies", str(POLICIES), "--engine", "eval")
    assert rc == 0, err
    report = json.loads(text)
    assert report["skipped"]["garbled"] == 2 and report["replayed"] == len(lines) - 2


def test_policy_check_on_a_deeply_nested_data_file_is_one_error(tmp_path: Path) -> None:
    data = tmp_path / "deep.json"
    data.write_text('{"roles":' + "[" * DEEP + "]" * DEEP + "}")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", "--data", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: cannot read the data file {data}: it is nested too deeply to be read"


# --- defect 4: policy eval on the other entrypoints -------------------------------------------------------


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "eval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


LIST_INPUT: dict[str, Any] = {
    "contract_version": 1,
    "kind": "list",
    "principal": {"client_id": None, "groups": ["pve-admins"], "iss": "pvegate", "kind": "human", "roles": [],
                  "scopes": ["pve.read"], "sub": "carol"},
    "request": {"hour_utc": 15, "id": "req-1", "method": "tools/list", "protocol_version": "2025-11-25",
                "source_ip": "127.0.0.1", "time": "2026-11-25T15:40:00Z", "time_ns": 1795621200000000000,
                "weekday": "Wed"},
    "tools": [
        {"connector": "pve_api", "domain": "node", "effect": "read", "name": "list_nodes", "scope": "cluster",
         "tags": [], "title": "list_nodes"},
    ],
}  # fmt: skip


def _approve_input(sub: str, groups: list[str]) -> dict[str, Any]:
    return {
        "contract_version": 1,
        "kind": "approve",
        "approver": {"client_id": None, "groups": groups, "iss": "pvegate", "kind": "human", "roles": [],
                     "scopes": ["pve.read"], "sub": sub},
        "authentication": {"auth_time": 1795621100, "via": "bearer"},
        "pending": {"id": "apr-1", "requester": "agent-ops-1", "approver_groups": ["ops-approvers"],
                    "min_approvals": 1, "approvals_so_far": [], "arguments_digest": "sha256:00",
                    "tool": LIST_INPUT["tools"][0], "target": {"cluster": "default", "node": "pve1", "vmid": 100,
                    "type": "qemu", "tags": [], "pool": None}, "risk": {"level": "high", "score": 60},
                    "expires_at": "2026-11-25T16:00:00Z"},
        "request": {**LIST_INPUT["request"], "method": "approvals/approve", "protocol_version": None},
    }  # fmt: skip


def test_eval_of_visible_tools_and_approver_answers_as_the_gateway_acts(tmp_path: Path) -> None:
    """On invalid data the gateway lists no tool and refuses the vote (data.invalid); eval printed OPA's
    raw list and `allow: true`, exit 0."""
    bad = _tree(tmp_path, "baddata")
    with (bad / "data" / "data.yaml").open("a") as f:
        f.write("\nrolez_typo: 1\n")
    listing, vote = tmp_path / "list.json", tmp_path / "approve.json"
    listing.write_text(json.dumps(LIST_INPUT))
    vote.write_text(json.dumps(_approve_input("bob", ["ops-approvers"])))
    ok = _eval("--policies", str(POLICIES), "--entrypoint", "visible_tools", "-i", str(listing))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"visible_tools": ["list_nodes"], "failed_closed": False}
    done = _eval("--policies", str(bad), "--entrypoint", "visible_tools", "-i", str(listing))
    assert done.returncode == 1 and "error: the tool listing failed closed" in done.stderr
    out = json.loads(done.stdout)
    assert out["visible_tools"] == [] and out["failed_closed"] is True
    done = _eval("--policies", str(bad), "--entrypoint", "approver", "-i", str(vote))
    out = json.loads(done.stdout)
    assert out["allow"] is False and out["deny_codes"] == ["data.invalid"], out
    good = _eval("--policies", str(POLICIES), "--entrypoint", "approver", "-i", str(vote))
    assert good.returncode == 0 and json.loads(good.stdout)["failed_closed"] is False, good.stderr


# --- defect 5: verified before compiled; the data file named ----------------------------------------------


def test_a_signed_bundle_with_an_unsigned_file_is_refused_as_a_signature(audit: Path, tmp_path: Path) -> None:
    from gateway.policy.bundles import build, keygen

    priv, pub = keygen(tmp_path / "keys")
    build(POLICIES, tmp_path / "ok.tar.gz", priv, checks=False)
    extra = tmp_path / "extra.tar.gz"
    with tarfile.open(tmp_path / "ok.tar.gz") as tin, tarfile.open(extra, "w:gz") as tout:
        for m in tin.getmembers():
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
        added = b"package pvegate.extra\n\nx := http.send({})\n"  # would not compile offline either
        info = tarfile.TarInfo("pvegate/extra.rego")
        info.size = len(added)
        tout.addfile(info, io.BytesIO(added))
    with pytest.raises(ReplayError) as exc:
        with ServerEngine(Candidate(bundle=extra, verification_key=pub)):
            pass
    assert "does not verify" in str(exc.value) and "without network access" not in str(exc.value), exc.value


def test_explain_names_a_missing_data_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = POLICIES / "golden" / "agent_may_not_migrate.json"
    missing = tmp_path / "missing.yaml"
    assert main(["policy", "explain", "-i", str(case), "--data", str(missing)]) == 2
    _, err = capsys.readouterr()
    assert f"cannot read the data file {missing}" in err and "cannot read input" not in err
