"""`pvegate policy replay` as a CI gate must not pass on a replay that never asked the candidate
anything, and the policy CLI must say why it got no answer (found in review).

A sample audit is written by the real audit writer (bench/replay_audit.py, decisions by the real
OPA on the shipped policies); each test replays it, through the CLI, against a candidate that is
broken in one way, and checks the exit status and the error a user sees (never a traceback).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable
from gateway.store.replay import Candidate, ReplayError, ServerEngine
from tests.policy.conftest import decisions

POLICIES = REPO_ROOT / "policies"


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The CLI's temporary files go here (in-process runs), so a test can see none is left."""
    d = tmp_path / "t"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    yield d


def _replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str
) -> tuple[int, dict[str, Any] | None, str, str]:
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    capsys.readouterr()
    rc = main(["policy", "replay", *args, "--format", "json", "-o", str(out)])
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stdout + stderr
    return rc, json.loads(out.read_text()) if out.exists() else None, stdout, stderr


def _undefined_candidate(tmp_path: Path) -> Path:
    """The shipped policy under a misspelt package: data.pvegate.decision is undefined for every input."""
    cand = tmp_path / "undefined"
    (cand / "pvegate").mkdir(parents=True)
    (cand / "pvegate" / "typo.rego").write_text('package pvegate_typo\n\ndecision := {"allow": true}\n')
    return cand


# --- defect 2: a gate that passes without a verdict of the candidate ---------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A signed bundle of the shipped policies, a tampered copy of it, and the verification key."""
    import io

    from gateway.policy.bundles import build, keygen

    d = tmp_path_factory.mktemp("tampered")
    priv, pub = keygen(d / "keys")
    build(POLICIES, d / "ok.tar.gz", priv, checks=False)
    evil = d / "evil.tar.gz"
    with tarfile.open(d / "ok.tar.gz") as tin, tarfile.open(evil, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            if m.name.lstrip("/") == "pvegate/decision.rego" and data is not None:
                data += b"\n# allow everything, says the attacker\n"
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data) if data is not None else None)
    return d / "ok.tar.gz", evil, pub


@pytest.mark.parametrize("engine", ["server", "eval"])
def test_a_candidate_without_a_decision_is_an_error_not_a_passed_gate(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    """Every answer undefined used to be 'deny' everywhere: a deny-to-allow gate passed (exit 0)."""
    cand = _undefined_candidate(tmp_path)
    args = ["--db", str(audit), "--policies", str(cand), "--fail-on", "deny-to-allow", "--engine", engine]
    rc, report, _, err = _replay(capsys, tmp_path, *args)
    assert rc == 2 and report is None
    assert "the candidate gave no verdict on any of the" in err and "policy result undefined" in err


def test_undecided_answers_are_counted_and_fail_the_gate_whatever_fail_on_says(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A candidate answering outside the contract for one tool: those answers are counted apart
    and fail the run, even on a gate whose kinds they do not match, and without a gate."""
    listed = [r for r in decisions(audit) if r["tool"] == "list_nodes" and '"input_z"' in r["body"]]
    assert listed
    cand = tmp_path / "cand"
    shutil.copytree(POLICIES, cand)
    rego = cand / "pvegate" / "decision.rego"
    text = rego.read_text()
    main_rule = '"contract_version": contract_version,\n\t"allow": allow,'
    assert text.count(main_rule) == 1
    rego.write_text(
        text.replace(
            main_rule,
            '"contract_version": contract_version + to_number(input.tool.name == "list_nodes"),\n\t"allow": allow,',
        )
    )
    rc, report, _, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(cand), "--fail-on", "deny-to-allow"
    )
    assert rc == 1 and report is not None, err
    assert report["undecided"] == len(listed) and report["failed"] is True
    assert report["failing"] == 0  # no deny-to-allow: the undecided answers alone fail it
    assert sum(report["undecided_problems"].values()) == len(listed)
    assert {c["request_id"] for c in report["changes"] if "problem" in c["after"]} == {r["request_id"] for r in listed}
    # the text summary says so too, and the run fails without --fail-on as well
    capsys.readouterr()
    assert main(["policy", "replay", "--db", str(audit), "--policies", str(cand), "--engine", "eval"]) == 1
    out = capsys.readouterr().out
    assert f"undecided: {len(listed)} answer(s) undefined or outside the decision contract" in out
    assert f"gate:      FAILED: {len(listed)} undecided answer(s)" in out


def test_a_good_candidate_reports_no_undecided_answer(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report, out, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(POLICIES), "--fail-on", "any"
    )
    assert rc == 0 and report is not None, err
    assert report["undecided"] == 0 and report["undecided_problems"] == {} and report["replayed"] > 0
    assert "undecided: 0 answer(s)" in out


@pytest.mark.parametrize("how", ["missing", "bundle-file", "no-policy-files", "data-only", "bundle-missing"])
def test_a_candidate_path_that_stages_no_policy_is_an_error(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """A mistyped --policies path (or a bundle given as --policies) was replayed as an empty policy."""
    if how == "missing":
        cand, expect = ["--policies", str(tmp_path / "no-such-dir")], "does not exist"
    elif how == "bundle-file":
        tgz = tmp_path / "candidate.tar.gz"
        with tarfile.open(tgz, "w:gz") as tar:
            tar.add(POLICIES / "pvegate" / "decision.rego", arcname="pvegate/decision.rego")
        cand, expect = ["--policies", str(tgz)], "give it with --bundle"
    elif how == "no-policy-files":
        d = tmp_path / "notes"
        d.mkdir()
        (d / "README.md").write_text("no policy here\n")
        cand, expect = ["--policies", str(d)], "holds no policy or data file"
    elif how == "data-only":
        cand, expect = ["--policies", str(POLICIES / "data")], "has no Rego policy"
    else:
        cand, expect = ["--bundle", str(tmp_path / "absent.tar.gz")], "does not exist"
    rc, report, _, err = _replay(capsys, tmp_path, "--db", str(audit), *cand, "--fail-on", "deny-to-allow")
    assert rc == 2 and report is None and expect in err, err


@pytest.mark.parametrize("extra", [["--data", "policies/data"], ["--policies", "/does/not/exist"]])
def test_a_bundle_with_data_or_policies_is_an_error(
    audit: Path, bundles: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    """OPA runs the bundle alone: the extra candidate files were ignored without a word (exit 0)."""
    bundle, _, pub = bundles
    key = ["--bundle", str(bundle), "--verification-key", str(pub)]
    rc, report, _, err = _replay(capsys, tmp_path, "--db", str(audit), *key, "--fail-on", "any", *extra)
    assert rc == 2 and report is None and "a bundle or policy files, not both" in err
    with pytest.raises(ReplayError, match="not both"):
        Candidate(policies=(POLICIES,), bundle=bundle)


def test_a_replay_of_no_decision_is_an_error_unless_allowed(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped --tool replayed 0 decisions and passed the gate."""
    args = ["--db", str(audit), "--policies", str(POLICIES), "--tool", "vm_stopp", "--fail-on", "any"]
    rc, report, _, err = _replay(capsys, tmp_path, *args)
    assert rc == 2 and report is None
    assert "no recorded decision was replayed" in err and "--allow-empty" in err
    rc, report, _, err = _replay(capsys, tmp_path, *args, "--allow-empty")
    assert rc == 0 and report is not None and report["replayed"] == 0, err


# --- defect 8: bad options and malformed export lines -------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--concurrency", "0"),
        ("--concurrency", "-1"),
        ("--examples", "-1"),
        ("--fail-above", "-1"),
        ("--concurrency", "x"),
    ],
)
def test_bad_counts_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    """--concurrency 0 hung (Semaphore(0)), -1 was a traceback, negative --examples/--fail-above were taken."""
    args = ["policy", "replay", "--db", str(tmp_path / "none.db"), "--policies", str(POLICIES)]
    with pytest.raises(SystemExit) as exit_:
        main([*args, option, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and "Traceback" not in err
    with pytest.raises(ReplayError, match="at least 1"):  # and the library refuses a zero concurrency too
        ServerEngine(Candidate(policies=(POLICIES,)), concurrency=0)


def test_malformed_export_lines_are_errors_or_garbled_never_tracebacks(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.store.audit import export_line

    rows = [r for r in decisions(audit) if '"input_z"' in r["body"] and '"failed_closed": true' not in r["body"]]
    lines = [json.loads(export_line(r)) for r in rows]
    assert len(lines) > 5
    del lines[0]["request_id"]  # was KeyError 'request_id'
    lines[1]["seq"] = "abc"  # was ValueError from int()
    lines[2]["body"]["risk"] = "high"  # was AttributeError
    lines[3]["principal"] = ["a", "list"]
    export = tmp_path / "decisions.jsonl"
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["--export", str(export), "--policies", str(POLICIES), "--engine", "eval"]
    rc, report, _, err = _replay(capsys, tmp_path, *args)
    assert rc == 0 and report is not None, err
    assert report["skipped"]["garbled"] == 4 and report["replayed"] == len(lines) - 4
    # a line that is not UTF-8 (was UnicodeDecodeError) or not JSON: an error naming the line
    export.write_bytes(export.read_bytes() + b"\xff\xfe not text\n")
    rc, report, _, err = _replay(capsys, tmp_path, *args)
    assert rc == 2 and report is None and f"{export}:{len(lines) + 1}: not UTF-8" in err


# --- defect 7: OPA's reason for refusing a bundle -----------------------------------------------------


def test_replay_and_eval_name_opas_reason_for_refusing_a_bundle(
    audit: Path, bundles: tuple[Path, Path, Path], tmp_path: Path, private_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both said only 'OPA exited with status 1 during start-up' (its stderr went to DEVNULL)."""
    _, evil, pub = bundles
    key = ["--bundle", str(evil), "--verification-key", str(pub)]
    rc, report, _, err = _replay(capsys, tmp_path, "--db", str(audit), *key)
    assert rc == 2 and report is None
    assert "did not start" in err and "digest mismatch" in err and "(log: " not in err
    doc = tmp_path / "input.json"
    doc.write_text(json.dumps({"contract_version": 1, "kind": "call"}))
    capsys.readouterr()
    assert main(["policy", "eval", "-i", str(doc), *key]) == 1
    out, err = capsys.readouterr()
    assert not out and "digest mismatch" in err and "Traceback" not in err
    assert list(private_tmp.iterdir()) == []  # the temporary log files are gone


def test_a_started_sidecar_leaves_no_log_file(private_tmp: Path) -> None:
    from gateway.store.replay import start_short_lived

    sidecar = OPASidecar(policies=(POLICIES,))
    start_short_lived(sidecar)
    try:
        assert sidecar.alive() and sidecar.log_file is None
        assert not [p for p in private_tmp.iterdir() if p.name.startswith("pvegate-opa-start-")]
    finally:
        sidecar.stop()
    with pytest.raises(OPAUnavailable):  # an OPA that cannot start: its log removed as well
        start_short_lived(OPASidecar(bundle=private_tmp / "absent.tar.gz"))
    assert list(private_tmp.iterdir()) == []


# --- defect 9: eval against an unreachable OPA --------------------------------------------------------


def test_eval_exits_non_zero_when_the_decision_failed_closed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed the failed-closed decision and exited 0, as for a real verdict."""
    doc = tmp_path / "input.json"
    doc.write_text((POLICIES / "golden" / "agent_may_not_migrate.json").read_text())
    assert main(["policy", "eval", "-i", str(doc), "--opa-url", "http://127.0.0.1:1"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["failed_closed"] is True
    assert "error: the decision failed closed" in err and "OPA unreachable" in err
