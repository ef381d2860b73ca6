"""A secret pasted where its file or variable's name belongs is never repeated in an error: the
start error and `pvegate config check` go to logs and terminals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, SecretRef, load, parse

from .conftest import run_pvegate, write

TOKEN = "PVEAPIToken=root@pam!x=aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
SECRET = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.mark.parametrize("value", [TOKEN, "root@pam!x=" + SECRET, "1PVE_TOKEN", "PVE TOKEN"])
def test_an_env_name_that_is_no_variable_name_is_refused_without_it(
    base: dict[str, Any], tmp_path: Path, value: str
) -> None:
    base["clusters"][0]["token"] = {"env": value}
    with pytest.raises(ConfigError) as err:
        parse(base, tmp_path)
    text = "\n".join(err.value.problems)
    assert "clusters.default.token.env: not a valid environment variable name" in text, text
    assert value not in text and SECRET not in text, text


def test_config_check_does_not_echo_a_token_in_env(base: dict[str, Any], tmp_path: Path) -> None:
    base["clusters"][0]["token"] = {"env": TOKEN}
    done = run_pvegate("config", "check", str(write(tmp_path, base)))
    assert done.returncode == 1
    assert "not a valid environment variable name" in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr, done.stderr


@pytest.mark.parametrize("value", [TOKEN, SECRET])
def test_reading_a_secret_file_named_by_a_token_does_not_echo_it(tmp_path: Path, value: str) -> None:
    ref = SecretRef(file=tmp_path / value, setting="clusters.default.token")
    with pytest.raises(ConfigError) as err:
        ref.read()
    text = str(err.value)
    assert text.startswith("clusters.default.token: cannot read secret file ("), text
    assert SECRET not in text, text


def test_reading_a_secret_file_that_looks_like_a_path_names_it(tmp_path: Path) -> None:
    ref = SecretRef(file=tmp_path / "secrets" / "pve-token", setting="clusters.default.token")
    with pytest.raises(ConfigError) as err:
        ref.read()
    assert str(tmp_path / "secrets" / "pve-token") in str(err.value)


def test_an_env_ref_built_outside_the_schema_is_not_echoed() -> None:
    """opa.services credentials are OPA's own section: their refs are not the schema's `secret`."""
    with pytest.raises(ConfigError) as err:
        SecretRef(env=TOKEN, setting="opa.services.s.credentials.bearer.token").read()
    assert "not a valid environment variable name" in str(err.value)
    assert SECRET not in str(err.value)


def test_a_start_with_a_token_in_env_does_not_echo_it(base: dict[str, Any], tmp_path: Path) -> None:
    base["clusters"][0]["token"] = {"env": TOKEN}
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    assert SECRET not in str(err.value)


def test_a_refs_repr_does_not_show_a_pasted_secret(tmp_path: Path) -> None:
    assert SECRET not in repr(SecretRef(env=TOKEN)) + repr(SecretRef(file=tmp_path / TOKEN))
    assert repr(SecretRef(env="PVE_TOKEN")) == "SecretRef(file=None, env=PVE_TOKEN)"
