"""A secret written inside its mapping as a key, or as a YAML value of another type, was echoed.

`token: {pvegate@pve!gw=<uuid>}` (braces taken for a placeholder) is a mapping whose one key is
the Proxmox token: the problem line was `clusters.default.token.pvegate@pve!gw=<uuid>: unknown
setting`, on the terminal and in the service's journal. A key YAML reads as a number was quoted by
the non-string-key check, and `env: !!binary ...` (or a set, a date) was shown by its repr in a
line that says "not shown". The secret's mapping is now named without its keys, and a value of
another type by its kind only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from tests.config.conftest import run_pvegate, write

PVE_TOKEN = "pvegate@pve!gw=8c1f0a2e-4b7d-4e3a-9f61-2d5c7b9e0a14"


def _load_text(tmp_path: Path, base: dict[str, Any], token_yaml: str) -> ConfigError:
    path = write(tmp_path, base)
    text = path.read_text().replace("token:\n    file: secrets/pve-token", f"token: {token_yaml}")
    assert text != path.read_text()
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    return err.value


@pytest.mark.parametrize(
    ("token_yaml", "secret"),
    [
        ("{" + PVE_TOKEN + "}", PVE_TOKEN),
        ("{file: secrets/pve-token, hunter2-s3cret: null}", "hunter2-s3cret"),
        ("{731942658017: null}", "731942658017"),
        ("{env: !!binary aHVudGVyMi1zM2NyZXQ=}", "hunter2-s3cret"),
        ("{env: !!set {hunter2-s3cret}}", "hunter2-s3cret"),
    ],
)
def test_a_secret_in_its_mapping_is_refused_without_showing_it(
    base: dict[str, Any], tmp_path: Path, token_yaml: str, secret: str
) -> None:
    err = _load_text(tmp_path, base, token_yaml)
    assert secret not in str(err), err.problems
    assert all(line.startswith("clusters.default.token") for line in err.problems), err.problems
    assert any("not shown" in line for line in err.problems), err.problems


def test_config_check_does_not_print_it(base: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, base)
    path.write_text(path.read_text().replace("token:\n    file: secrets/pve-token", "token: {" + PVE_TOKEN + "}"))
    done = run_pvegate("config", "check", str(path))
    assert done.returncode == 1
    assert "clusters.default.token: expected {file: PATH} or {env: NAME}" in done.stderr, done.stderr
    assert PVE_TOKEN not in done.stdout + done.stderr
