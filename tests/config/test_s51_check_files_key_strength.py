"""`pvegate config check --files` said OK to keys `pvegate serve` then refused to start with.

`--files` is meant to check the secrets as serve's start does (there, readable, not empty), so an
operator can trust it before a deploy or a rolling restart. It never ran serve's length checks: an
HS256 secret under 32 bytes, a `state_key` under 32 characters and an enabled console's
`session_key` under 32 characters were "OK", and serve then failed (`cannot start: state_key: the
key is 12 characters...`). Both now run the same check (gateway.server.check_secret_strength); the
key itself is never shown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.config.conftest import run_pvegate, write

SHORT = "shortS51keyValue"  # 16 characters: never to be echoed


def _short_file(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "secrets" / "short"
    path.write_text(SHORT + "\n")
    os.chmod(path, 0o600)
    return {"file": "secrets/short"}


def _hs256(c: dict[str, Any], ref: dict[str, str]) -> None:
    c["auth"]["hs256_secret"] = ref


def _state_key(c: dict[str, Any], ref: dict[str, str]) -> None:
    c["state_key"] = ref


def _session_key(c: dict[str, Any], ref: dict[str, str]) -> None:
    c["public_url"] = "https://gw.example"
    c["console"] = {
        "enabled": True,
        "issuer": "https://idp.example/realms/x",
        "client_id": "pvegate",
        "session_key": ref,
    }


@pytest.mark.parametrize(
    ("put", "message"),
    [
        (_hs256, "auth.hs256_secret: the secret is 16 bytes; an HS256 secret needs at least 32"),
        (_state_key, "state_key: the key is 16 characters, at least 32 are needed"),
        (_session_key, "console.session_key must be at least 32 characters"),
    ],
)
def test_a_short_key_is_refused_by_check_files(base: dict[str, Any], tmp_path: Path, put: Any, message: str) -> None:
    put(base, _short_file(tmp_path))
    path = write(tmp_path, base)
    out = run_pvegate("config", "check", "--files", str(path))
    assert out.returncode == 1, out
    assert message in out.stderr
    assert "OK" not in out.stdout
    assert SHORT not in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_long_enough_keys_pass(base: dict[str, Any], tmp_path: Path) -> None:
    base["state_key"] = {"file": "secrets/jwt"}  # 36 characters
    _session_key(base, {"file": "secrets/jwt"})
    path = write(tmp_path, base)
    out = run_pvegate("config", "check", "--files", str(path))
    assert out.returncode == 0, out
    assert out.stdout.strip() == f"{path}: OK"
