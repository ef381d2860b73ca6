"""`pvegate policy replay` on odd but readable records: a traceback, a different input, a wrong selection.

What was wrong (each reproduced through the CLI on the sample audit the real writer wrote):

- A pending decision whose approval lives longer than the platform's clock can show (`ttl_seconds`
  10**20: an integer of at least 1, as the decision contract asks) crashed the baseline comparison
  with an OverflowError traceback and exit 1, which a CI gate reads as "the candidate failed".
- An export line whose kept input has a `request` that is no object crashed the same comparison
  (TypeError traceback, exit 1).
- A kept input holding NaN, Infinity or a number past a double (1e400) was replayed: the server
  engine crashed on it (ValueError traceback, exit 1); `opa eval` read the file as YAML and
  decided on the string "NaN", an input the gateway never sent. No OPA was ever asked on one: it
  is garbled.
- `--principal`/`--tool` on an export took `?` and `[...]` as glob characters without a `*`,
  where the database takes the name as it is: `--principal 'ops[1]'` replayed ops1's decisions
  and silently skipped those of `ops[1]`.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.store.audit import pack_input
from tests.policy.conftest import export_rows

POLICIES = REPO_ROOT / "policies"


def _input(row: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(row["body"]["input_z"])))
    return doc


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    capsys.readouterr()
    rc = main(["policy", "replay", *args, "--policies", str(POLICIES), "--format", "json", "-o", str(out)])
    stdout, stderr = capsys.readouterr()
    assert "Traceback" not in stdout + stderr
    return rc, json.loads(out.read_text()) if out.exists() else {}, stderr


@pytest.mark.parametrize("odd", ["ttl", "request"])
def test_an_odd_pending_decision_is_compared_with_the_baseline_not_a_traceback(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], odd: str
) -> None:
    rows = export_rows(audit)
    pending = next(r for r in rows if r["outcome"] == "pending")
    if odd == "ttl":
        pending["body"]["approval"]["ttl_seconds"] = 10**20
    else:
        doc = _input(pending)
        doc["request"] = ["not", "an", "object"]
        pending["body"]["input_z"] = pack_input(json.dumps(doc))
    export = _write(tmp_path / "odd.jsonl", rows)
    args = ["--export", str(export), "--baseline-policies", str(POLICIES), "--engine", "eval"]
    rc, report, err = _replay(capsys, tmp_path, *args)
    assert rc == 0, err
    assert report["replayed"] == len(rows) and report["scope"]["compared_with_baseline"] is True
    assert report["scope"]["baseline_inputs"]["approver"] > 0


@pytest.mark.parametrize("engine", ["server", "eval"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e400"])
def test_a_kept_input_that_is_no_json_value_is_garbled(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], engine: str, value: str
) -> None:
    rows = export_rows(audit)
    text = json.dumps(_input(rows[0]))
    assert text.startswith("{")
    rows[0]["body"]["input_z"] = pack_input('{"odd": ' + value + ", " + text[1:])
    export = _write(tmp_path / "nan.jsonl", rows)
    rc, report, err = _replay(capsys, tmp_path, "--export", str(export), "--engine", engine)
    assert rc == 0, err
    assert report["skipped"]["garbled"] == 1 and report["replayed"] == len(rows) - 1


def test_an_export_filter_without_a_star_is_a_name(
    audit: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = export_rows(audit)
    for i, r in enumerate(rows):
        r["principal"] = "ops[1]" if i % 3 == 0 else "ops1"
    named = sum(1 for r in rows if r["principal"] == "ops[1]")
    assert 0 < named != len(rows) - named
    export = _write(tmp_path / "names.jsonl", rows)
    rc, report, err = _replay(capsys, tmp_path, "--export", str(export), "--principal", "ops[1]")
    assert rc == 0, err
    assert report["replayed"] == named  # its own decisions, not ops1's
    # a `*` still makes it a glob, as in the database
    rc, report, err = _replay(capsys, tmp_path, "--export", str(export), "--principal", "ops*")
    assert rc == 0 and report["replayed"] == len(rows), err
    # and in a glob `[` is itself, as on both databases: `ops[1]*` is ops[1]'s, not a class matching ops1
    rc, report, err = _replay(capsys, tmp_path, "--export", str(export), "--principal", "ops[1]*")
    assert rc == 0 and report["replayed"] == named, err
