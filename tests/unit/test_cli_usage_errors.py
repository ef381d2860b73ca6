"""Wrong CLI input answered with one line and a documented exit status, never a traceback or a
silent default: a --policies that is no policy directory, blank flag values, and a PVE schema
named by the environment that cannot be read.

Each runs the real `pvegate` in a subprocess (with a timeout), its environment without PVEGATE_*.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pvegate(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, **(env or {})},
        timeout=120,
    )


def _error_line(r: subprocess.CompletedProcess[str]) -> str:
    """stderr (log lines aside) is one `error: ...` line (argparse's usage lines aside); that line."""
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if not line.startswith(("INFO ", "WARNING "))]
    errors = [line for line in lines if "error: " in line]
    assert len(errors) == 1, r.stderr
    return errors[0]


# --- --policies that is no policy directory: eval and check answer as explain does ----------------


@pytest.mark.parametrize("command", ["eval", "explain", "check"])
def test_a_missing_policy_directory_is_a_usage_error(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nonexistent"
    doc = tmp_path / "input.json"
    doc.write_text("{}")
    given = ["--input", str(doc)] if command != "check" else []
    r = _pvegate("policy", command, *given, "--policies", str(missing))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    assert _error_line(r) == f"error: {missing} is not a policy directory (no pvegate/)"


def test_policy_eval_refuses_a_directory_without_a_policy(tmp_path: Path) -> None:
    """Not started on it: OPA would answer undefined, which passes for a failed-closed decision."""
    doc = tmp_path / "input.json"
    doc.write_text("{}")
    r = _pvegate("policy", "eval", "--input", str(doc), "--policies", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert _error_line(r) == f"error: {tmp_path} is not a policy directory (no pvegate/)"


# --- blank values: a usage error naming the flag, not a gate on nothing or a silent default --------


@pytest.mark.parametrize("kinds", ["", " , ", " "])
def test_replay_fail_on_naming_no_kind_is_a_usage_error(tmp_path: Path, kinds: str) -> None:
    export = tmp_path / "export.jsonl"
    export.write_text("")  # without the blank --fail-on this replay runs, and passes (exit 0)
    args = ["--export", str(export), "--policies", str(ROOT / "policies"), "--allow-empty", "--engine", "eval"]
    r = _pvegate("policy", "replay", *args, "--fail-on", kinds)
    assert r.returncode == 2 and r.stdout == ""
    assert "argument --fail-on: no change kind given" in _error_line(r)


@pytest.mark.parametrize("revision", ["", "  "])
def test_bundle_build_with_a_blank_revision_is_a_usage_error(tmp_path: Path, revision: str) -> None:
    out = tmp_path / "b.tar.gz"
    r = _pvegate("bundle", "build", "--unsigned", "--plain", "-o", str(out), "--revision", revision)
    assert r.returncode == 2 and r.stdout == ""
    assert "argument --revision: a blank revision" in _error_line(r)
    assert not out.exists()


@pytest.mark.parametrize("out", ["", " "])
def test_bundle_keygen_into_a_blank_directory_is_a_usage_error(tmp_path: Path, out: str) -> None:
    r = _pvegate("bundle", "keygen", "--out", out, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert "argument --out: a blank directory" in _error_line(r)
    assert list(tmp_path.iterdir()) == []  # no key pair in the current directory


# --- tools show: a schema named by the environment that cannot be read fails, as --pve-schema does --


def test_tools_show_with_an_unreadable_schema_from_the_environment_fails(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    by_flag = _pvegate("tools", "show", "vm_stop", "--pve-schema", str(missing))
    by_env = _pvegate("tools", "show", "vm_stop", env={"PVEGATE_PVE_SCHEMA": str(missing)})
    for r in (by_flag, by_env):
        assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout)
        assert _error_line(r).startswith(f"error: cannot read PVE schema {missing}")


def test_tools_show_with_a_schema_directory_that_is_not_there_fails(tmp_path: Path) -> None:
    missing = tmp_path / "schemas"
    r = _pvegate("tools", "show", "vm_stop", env={"PVEGATE_PVE_SCHEMA_DIR": str(missing)})
    assert r.returncode == 1 and r.stdout == ""
    line = _error_line(r)
    assert line.startswith("error: no PVE 8.4 API schema") and line.endswith(f"in {missing} ($PVEGATE_PVE_SCHEMA_DIR)")


def test_tools_show_with_the_shipped_schemas_names_the_privilege() -> None:
    r = _pvegate("tools", "show", "vm_stop")
    assert r.returncode == 0, r.stderr
    assert "Proxmox privileges (from " in r.stdout and "VM.PowerMgmt on /vms/{vmid}" in r.stdout
