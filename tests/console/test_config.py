"""The console's configuration: mistakes are refused at load, with the setting named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from tests.config.conftest import minimal, write


def console(tmp_path: Path, **over: Any) -> dict[str, Any]:
    raw = minimal(tmp_path)
    (tmp_path / "secrets" / "console-key").write_text("k" * 40)
    raw["public_url"] = "https://pvegate.example.org"
    raw["console"] = {
        "enabled": True,
        "issuer": "https://idp.example.org/realms/ops/",
        "client_id": "pvegate-console",
        "session_key": {"file": "secrets/console-key"},
        **over,
    }
    return raw


def test_a_console_configuration_loads(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, console(tmp_path, idle_timeout_seconds=300))).console
    assert cfg.enabled and cfg.issuer == "https://idp.example.org/realms/ops"  # the trailing slash is not kept
    assert cfg.idle_timeout_seconds == 300 and cfg.max_session_seconds == 28800
    assert cfg.client_secret is None and cfg.scopes == ("openid", "profile", "email")
    assert cfg.session_key is not None and cfg.session_key.read() == "k" * 40


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"issuer": "http://idp.example.org/realms/ops"}, "console.issuer: must be an https URL"),
        ({"idle_timeout_seconds": 5}, "console.idle_timeout_seconds"),
        ({"client_id": ""}, "console.client_id"),
        ({"sesion_key": {"file": "x"}}, "sesion_key"),
    ],
)
def test_console_mistakes_are_refused(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(write(tmp_path, console(tmp_path, **change)))
    assert message in str(exc.value)


def test_the_console_needs_public_url(tmp_path: Path) -> None:
    raw = console(tmp_path)
    del raw["public_url"]
    with pytest.raises(ConfigError) as exc:
        load(write(tmp_path, raw))
    assert "console.enabled needs public_url" in str(exc.value)
