"""`pvegate config check --files`: the files the configuration names, checked as `pvegate serve`'s
start checks them (present and readable now), without starting anything."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

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


# -- secrets and the directories the gateway writes ------------------------------------------

ROOT = os.geteuid() == 0  # root reads and writes through any mode bits


def test_an_unset_secret_variable_is_named_not_its_value(
    base: dict[str, Any], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PVEGATE_TEST_UNSET_PVE_TOKEN", raising=False)
    base["clusters"][0]["token"] = {"env": "PVEGATE_TEST_UNSET_PVE_TOKEN"}
    path = write(tmp_path, base)
    code, out, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1, out
    assert f"{path}: clusters.default.token: environment variable PVEGATE_TEST_UNSET_PVE_TOKEN is not set" in err
    assert "a-test-signing-secret" not in out + err


def test_a_missing_service_secret_file_is_named(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    base["opa"] = {
        "services": {"siem": {"url": "https://logs.example", "credentials": {"bearer": {"token": {"file": "nope"}}}}}
    }
    path = write(tmp_path, base)
    code, _, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1
    assert f"opa.services.siem.credentials.bearer.token: cannot read secret file {tmp_path / 'nope'}" in err, err


@pytest.mark.skipif(ROOT, reason="root reads a file whatever its mode")
def test_an_unreadable_secret_file_is_named(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    secret = tmp_path / "secrets" / "jwt"
    secret.chmod(0)
    try:
        code, out, err = run(capsys, "config", "check", "--files", str(write(tmp_path, base)))
    finally:
        secret.chmod(0o600)
    assert code == 1 and f"auth.hs256_secret: cannot read secret file {secret}: Permission denied" in err, err
    assert "a-test-signing-secret" not in out + err


def test_every_problem_is_listed_once_each(
    base: dict[str, Any], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PVEGATE_TEST_UNSET_ADMIN", raising=False)
    (tmp_path / "a-file").write_text("x")
    base["admin"] = {"token": {"env": "PVEGATE_TEST_UNSET_ADMIN"}}
    base["state_dir"] = "a-file/state"  # under a regular file: fails for root too
    path = write(tmp_path, base)
    code, _, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1
    lines = err.splitlines()
    assert f"{path}: admin.token: environment variable PVEGATE_TEST_UNSET_ADMIN is not set" in lines, err
    assert any(line.startswith(f"{path}: state_dir {tmp_path / 'a-file/state'}: ") for line in lines), err
    assert not (tmp_path / "a-file").is_dir()


def test_an_audit_directory_that_cannot_be_made_is_named(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "a-file").write_text("x")
    base["audit"] = {"path": "a-file/db/audit.db"}
    path = write(tmp_path, base)
    code, _, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1 and "audit.path: the directory" in err and str(tmp_path / "a-file") in err, err


@pytest.mark.skipif(ROOT, reason="root writes into a directory whatever its mode")
def test_a_read_only_state_dir_is_named(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o500)
    try:
        code, _, err = run(capsys, "config", "check", "--files", str(write(tmp_path, base)))
    finally:
        state.chmod(0o700)
    assert code == 1 and f"state_dir {state}: not writable" in err, err


def test_a_state_dir_serve_would_make_passes_and_is_not_made(base: dict[str, Any], tmp_path: Path, capsys: Any) -> None:
    base["state_dir"] = "var/lib/pvegate/state"
    code, _, err = run(capsys, "config", "check", "--files", str(write(tmp_path, base)))
    assert code == 0, err
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize("content", ["", " \n\t\n"])
def test_an_empty_secret_file_is_refused_as_serve_refuses_it(
    base: dict[str, Any], tmp_path: Path, capsys: Any, content: str
) -> None:
    path = write(tmp_path, base)
    (tmp_path / "secrets" / "pve-token").write_text(content)
    code, out, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1, out
    assert f"{path}: clusters.default.token: the secret is empty" in err, err


@pytest.mark.parametrize("value", ["", "  \n"])
def test_an_empty_secret_variable_is_refused_as_serve_refuses_it(
    base: dict[str, Any], tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PVEGATE_TEST_EMPTY_PVE_TOKEN", value)
    base["clusters"][0]["token"] = {"env": "PVEGATE_TEST_EMPTY_PVE_TOKEN"}
    path = write(tmp_path, base)
    code, out, err = run(capsys, "config", "check", "--files", str(path))
    assert code == 1, out
    assert f"{path}: clusters.default.token: the secret is empty" in err, err
