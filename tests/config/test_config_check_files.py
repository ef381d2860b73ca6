"""`pvegate config check --files`: the files the configuration names, checked as `pvegate serve`'s
start checks them (present and readable now), without starting anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.cli import main
from tests.config.conftest import write


def run(capsys: Any, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_missing_ca_file_is_said_with_files(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    base["clusters"][0]["ca_file"] = "pve-ca.pem"
    path = write(tmp_path, base)
    code, out, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1, out
    assert err.strip() == (
        f"{path}: clusters.default.ca_file: cannot read {tmp_path / 'pve-ca.pem'}: No such file or directory"
    )
    assert not (tmp_path / "state").exists()  # nothing was started or created


def test_a_missing_jwks_file_is_said_with_files(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    base["auth"] = {**base["auth"], "algorithms": ["RS256"], "jwks_file": "jwks.json"}
    del base["auth"]["hs256_secret"]
    path = write(tmp_path, base)
    code, _, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1 and "auth.jwks_file: cannot read" in err, err


def test_files_present_pass(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "pve-ca.pem").write_text("x")
    base["clusters"][0]["ca_file"] = "pve-ca.pem"
    path = write(tmp_path, base)
    code, out, err = run(capsys, "config", "check", "--files", str(path))
    assert (code, out) == (0, f"{path}: OK\n"), err


def test_without_files_only_the_file_itself_is_checked(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    """A configuration checked off its host (CI, before deploying) names files that are not here."""
    base["clusters"][0]["ca_file"] = "pve-ca.pem"
    code, _, err = run(capsys, "config", "check", str(write(tmp_path, base)))
    assert code == 0, err
