"""`pvegate config check` and `pvegate config reference`, through the CLI's own entry point.

In-process (`main(argv)`, output captured) to stay fast; `pvegate serve` itself is run as
a subprocess in test_startup.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.core.config_schema import reference
from tests.config.conftest import write


@pytest.fixture
def run_pvegate(capsys: pytest.CaptureFixture[str]) -> Any:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def test_check_accepts_a_valid_file(base: dict[str, Any], tmp_path: Path, run_pvegate: Any) -> None:
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{path}: OK\n"
    assert not (tmp_path / "state").exists()  # nothing was started or created


def test_check_lists_every_problem_one_per_line(base: dict[str, Any], tmp_path: Path, run_pvegate: Any) -> None:
    base["auth"]["role_claim"] = "roles"
    base["clusters"][0]["timeout"] = "ten"
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        f"{path}: auth.role_claim: unknown setting; did you mean auth.roles_claim?",
        f"{path}: clusters.default.timeout: expected a number, got 'ten'",
    ]


def test_check_of_a_missing_file(tmp_path: Path, run_pvegate: Any) -> None:
    r = run_pvegate("config", "check", str(tmp_path / "nope.yaml"))
    assert r.returncode == 1
    assert r.stderr.strip() == f"{tmp_path / 'nope.yaml'}: cannot read the configuration: No such file or directory"


def test_other_commands_refuse_a_bad_config_too(base: dict[str, Any], tmp_path: Path, run_pvegate: Any) -> None:
    base["audit"] = {"retention_dayz": 30}
    path = write(tmp_path, base)
    r = run_pvegate("token", "mint", "--config", str(path), "--sub", "agent-1")
    assert r.returncode == 2
    expected = f"error: {path}: audit.retention_dayz: unknown setting; did you mean audit.retention_days?"
    assert r.stderr.strip() == expected


def test_reference_command_prints_the_generated_reference(tmp_path: Path, run_pvegate: Any) -> None:
    r = run_pvegate("config", "reference")
    assert r.returncode == 0 and r.stdout == reference()
    out = tmp_path / "configuration.md"
    assert run_pvegate("config", "reference", "-o", str(out)).returncode == 0
    assert out.read_text() == reference()
