"""`pvegate policy replay` as a CI gate, from a review of the policy lifecycle.

- a decision on an input with redacted arguments that compares equal was "replayed, unchanged" and the
  gate passed without a word: the report counts them (text and JSON), warns, and --fail-on-redacted
  fails the run on them;
- the candidate's data check is read as the gateway reads it (one function): a refusal that allows,
  or a check outside the contract, makes every answer undecided instead of an allow;
- `--engine eval` with a --verification-key always failed (`opa eval` has no such flag): the bundle
  is verified first and its verified copy evaluated;
- no opa binary (or an opa that does not finish) is one `error:` line and exit 2, not a traceback
  and exit 1 (1 is "gate failed" to CI);
- an export line whose time is inf, NaN or 1e300 is garbled, not a crash;
- a --verification-key file that is not there is said before OPA is asked.

The sample audit and the bundles are the fixtures of test_replay_gate.py (the real audit writer,
decisions by the real OPA on the shipped policies); every candidate is asked by a real OPA.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy.bundles import keygen
from tests.bundles.test_bundles import _no_opa
from tests.policy.conftest import export_rows
from tests.policy.test_replay_gate import POLICIES, _replay, bundles

__all__ = ["bundles"]  # a fixture, used by name

DENY_EVERYTHING = """package pvegate.guardrails

import data.pvegate.lib

denials contains lib.reason("guardrail.candidate", "candidate", "the candidate denies everything") if {
	input.tool.name != ""
}
"""


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _deny_everything(tmp_path: Path) -> Path:
    cand = tmp_path / "deny-all"
    shutil.copytree(POLICIES, cand)
    (cand / "pvegate" / "guardrails" / "lifecycle_candidate.rego").write_text(DENY_EVERYTHING)
    return cand


# --- 1: decisions on redacted inputs -----------------------------------------------------------------


def test_replayed_inputs_with_redacted_arguments_are_counted_and_can_fail_the_gate(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unchanged candidate on inputs kept with a redacted argument: 'changed: 0' and a passed gate
    used to be all the report said, though the candidate never saw the argument's value."""
    lines = export_rows(audit)
    marked = lines[: len(lines) // 2]
    for line in marked:
        line["body"]["input_redacted"] = ["arguments.snapname"]
    export = _write(tmp_path / "decisions.jsonl", lines)
    args = ["--export", str(export), "--policies", str(POLICIES), "--fail-on", "any", "--engine", "eval"]

    rc, report, out, err = _replay(capsys, tmp_path, *args)
    assert rc == 0 and report is not None, err
    assert report["changed"] == 0 and report["replayed"] == len(lines)
    assert report["redacted"] == len(marked) and report["redacted_changed"] == 0
    assert report["redacted_paths"] == {"arguments.snapname": len(marked)}
    assert report["fail_on_redacted"] is False and report["failed"] is False
    assert f"redacted:  {len(marked)} replayed input(s) with redacted arguments (not fully replayable)" in out
    assert f"warning: {len(marked)} of {len(lines)} replayed decisions rest on inputs with redacted arguments" in out
    assert "not gated (--fail-on-redacted)" in out  # the passed gate says what it did not gate

    rc, report, out, err = _replay(capsys, tmp_path, *args, "--fail-on-redacted")
    assert rc == 1 and report is not None, err
    assert report["failed"] is True and report["failing"] == 0  # the redacted inputs alone fail it
    assert "gate:      FAILED: 0 change(s) of" in out
    assert f"{len(marked)} replayed input(s) with redacted arguments (allowed: 0)" in out

    # without any redacted input the flag passes, and the report says none
    clean = _write(tmp_path / "clean.jsonl", export_rows(audit))
    rc, report, out, err = _replay(
        capsys, tmp_path, "--export", str(clean), "--policies", str(POLICIES), "--engine", "eval", "--fail-on-redacted"
    )
    assert rc == 0 and report is not None and report["redacted"] == 0, err
    assert "redacted:  0 replayed input(s)" in out and "warning:" not in out


# --- 2: the candidate's data check, read as the gateway reads it --------------------------------------

# the shipped data with a deny rule the schema refuses (the data is invalid)
BAD_RULE = "    - name: 42\n      tools: notalist\n"
REFUSAL = "data_refusal := fallback(data_denials) if count(data_denials) > 0"
PROBLEMS = '"problems": sort(config.problems),'


def _bad_check_candidate(tmp_path: Path, how: str) -> Path:
    cand = tmp_path / how
    shutil.copytree(POLICIES, cand)
    rego = cand / "pvegate" / "decision.rego"
    text = rego.read_text()
    if how == "refusal-allows":  # invalid data, and a refusal that allows: the gateway fails closed
        data = cand / "data" / "data.yaml"
        assert "  deny_rules:\n" in data.read_text() and text.count(REFUSAL) == 1
        data.write_text(data.read_text().replace("  deny_rules:\n", "  deny_rules:\n" + BAD_RULE, 1))
        allowing = 'object.union(fallback(data_denials), {"allow": true, "deny": [], "deny_reasons": []})'
        rego.write_text(text.replace(REFUSAL, f"data_refusal := {allowing} if count(data_denials) > 0"))
    else:  # valid data, but `problems` is no list of strings: outside the contract
        assert text.count(PROBLEMS) == 1
        rego.write_text(text.replace(PROBLEMS, '"problems": concat(", ", sort(config.problems)),'))
    return cand


@pytest.mark.parametrize("engine", ["server", "eval"])
@pytest.mark.parametrize("how", ["refusal-allows", "problems-not-a-list"])
def test_an_unusable_data_check_leaves_every_answer_undecided(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, engine: str
) -> None:
    """The gateway fails closed on such a check (DecisionClient); the replay used to take the
    allowing refusal (or the decision) as the candidate's verdict and pass."""
    cand = _bad_check_candidate(tmp_path, how)
    args = ["--db", str(audit), "--policies", str(cand), "--fail-on", "deny-to-allow", "--engine", engine]
    rc, report, _, err = _replay(capsys, tmp_path, *args)
    assert rc == 2 and report is None, err  # every answer undecided: the candidate cannot be evaluated
    assert "policy data check unavailable: data check" in err and "does not match the contract" in err


def test_a_data_check_outside_the_contract_makes_its_batch_undecided() -> None:
    """The batch reader on the shapes OPA can answer: each unusable check stands for no verdict."""
    from gateway.store.replay import _batch_results, verdict

    ok = {"contract_version": 1, "allow": False, "deny": ["no"], "deny_reasons": []}
    for check in (
        [{"valid": True, "problems": "none"}],
        [{"valid": "yes", "problems": []}],
        [{"valid": False, "problems": ["p"], "refusal": {**ok, "allow": True, "deny": []}}],
        [{"valid": False, "problems": ["p"], "refusal": None}],
        {"valid": True, "problems": []},  # not the list the batch query makes
    ):
        answers = _batch_results({"c": check, "x": {"0": ok, "1": ok}}, 2)
        for a in answers:
            v = verdict(a)
            assert v.problem is not None and "data check" in v.problem, (check, v)


# --- 3: a signed candidate bundle with --engine eval -----------------------------------------------


def test_the_eval_engine_verifies_a_signed_bundle_first(
    audit: Path, bundles: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`opa eval` has no --verification-key: the combination always failed ('unknown flag')."""
    ok, evil, pub = bundles
    args = ["--db", str(audit), "--engine", "eval", "--verification-key", str(pub)]
    rc, report, _, err = _replay(capsys, tmp_path, *args, "--bundle", str(ok), "--fail-on", "any")
    assert rc == 0 and report is not None, err
    assert report["replayed"] > 0 and report["undecided"] == 0 and report["changed"] == 0
    assert report["candidate"].endswith("(signature verified)")
    rc, report, _, err = _replay(capsys, tmp_path, *args, "--bundle", str(evil))
    assert rc == 2 and report is None
    assert "does not verify" in err and "digest mismatch" in err
    _, other_pub = keygen(tmp_path / "other")
    rc, _, _, err = _replay(capsys, tmp_path, "--db", str(audit), "--engine", "eval", "--bundle", str(ok),
                            "--verification-key", str(other_pub))  # fmt: skip
    assert rc == 2 and "does not verify" in err and "verification error" in err


# --- 4: no opa, or an opa that does not finish ---------------------------------------------------------


@pytest.mark.parametrize("engine", ["server", "eval"])
def test_without_opa_replay_is_an_error_not_a_traceback(
    audit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    _no_opa(monkeypatch, tmp_path)
    rc, report, out, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(POLICIES), "--engine", engine
    )
    assert rc == 2 and report is None and not out
    assert err.startswith("error: no opa binary found") and err.count("\n") == 1


def test_an_opa_that_does_not_finish_is_an_error(
    audit: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def hangs(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout") or 60)

    monkeypatch.setattr("gateway.store.replay.subprocess.run", hangs)
    rc, report, out, err = _replay(
        capsys, tmp_path, "--db", str(audit), "--policies", str(POLICIES), "--engine", "eval"
    )
    assert rc == 2 and report is None and not out
    assert err.startswith("error: ") and "did not finish within 60 s" in err and err.count("\n") == 1


# --- 5: an export line whose time is no time ---------------------------------------------------------


def test_an_export_time_that_is_no_time_is_garbled(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """inf, NaN and 1e300 passed as times; on a changed decision time.gmtime raised (a traceback)."""
    lines = export_rows(audit)
    allowed = [line for line in lines if line["outcome"] == "allow"]
    assert len(allowed) >= 3
    for line, ts in zip(allowed, (float("inf"), float("nan"), 1e300), strict=False):
        line["ts"] = ts  # json.dumps writes Infinity and NaN, as a damaged export holds them
    export = _write(tmp_path / "damaged.jsonl", lines)
    cand = _deny_everything(tmp_path)
    rc, report, _, err = _replay(capsys, tmp_path, "--export", str(export), "--policies", str(cand), "--engine", "eval")
    assert rc == 0 and report is not None, err
    assert report["skipped"]["garbled"] == 3 and report["replayed"] == len(lines) - 3
    assert report["changed"] > 0  # the candidate changes the others: each change shows its time
    assert all(c["time"].startswith("20") for c in report["changes"])


# --- 7: a verification key that is not there ---------------------------------------------------------


def test_a_missing_verification_key_is_named_before_opa_is_asked(
    audit: Path, bundles: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok, _, pub = bundles
    missing = tmp_path / "nope.pem"
    for engine in ("server", "eval"):
        rc, report, _, err = _replay(capsys, tmp_path, "--db", str(audit), "--bundle", str(ok),
                                     "--verification-key", str(missing), "--engine", engine)  # fmt: skip
        assert rc == 2 and report is None
        assert err == f"error: verification key {missing} not found\n"  # not OPA's "failed to parse PEM block"
    doc = tmp_path / "input.json"
    doc.write_text(json.dumps({"contract_version": 1, "kind": "call"}))
    capsys.readouterr()
    assert main(["policy", "eval", "-i", str(doc), "--bundle", str(ok), "--verification-key", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert not out and err == f"error: verification key {missing} not found\n"
    private = pub.parent / "bundle-signing.pem"
    assert private.is_file()
    rc, _, _, err = _replay(capsys, tmp_path, "--db", str(audit), "--bundle", str(ok),
                            "--verification-key", str(private))  # fmt: skip
    assert rc == 2 and "is a private (signing) key" in err
