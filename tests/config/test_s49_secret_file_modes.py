"""A secret file other users may read is said, by `pvegate serve` and by `pvegate config check --files`.

docs/deployment.md §4 has every secret file readable by the gateway's user alone, but only the SSH key
was held to it: a Proxmox token, the admin token or the HS256 signing secret left at 0644 loaded without
a word. It is a warning, not a refusal (a Kubernetes secret volume is 0644 unless its defaultMode says
otherwise); the warning names the setting, the file and its mode, never the secret."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.core.config import load
from gateway.server import check_secrets
from tests.config.conftest import write

TOKEN = "00000000-0000-0000-0000-000000000000"


def test_open_secret_files_are_warned_about_and_private_ones_are_not(
    base: dict[str, Any], tmp_path: Path, capsys: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, base)
    token, jwt = tmp_path / "secrets" / "pve-token", tmp_path / "secrets" / "jwt"
    token.chmod(0o644)
    jwt.chmod(0o640)
    assert main(["config", "check", "--files", str(path)]) == 0  # a warning: the check still passes
    err = capsys.readouterr().err
    assert f"warning: clusters.default.token: {token} is open to other users (mode 644): chmod 600 it" in err, err
    assert f"warning: auth.hs256_secret: {jwt} is open to other users (mode 640)" in err, err
    assert TOKEN not in err
    with caplog.at_level(logging.WARNING, logger="pvegate"):
        check_secrets(load(path))
    assert f"clusters.default.token: {token} is open to other users (mode 644)" in caplog.text
    assert TOKEN not in caplog.text

    token.chmod(0o600)
    jwt.chmod(0o400)
    caplog.clear()
    assert main(["config", "check", "--files", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="pvegate"):
        check_secrets(load(path))
    assert "open to other users" not in caplog.text
