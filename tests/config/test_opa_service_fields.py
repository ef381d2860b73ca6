"""opa.services credentials: only the fields OPA reads, and every secret among them from a file or an
environment variable (docs/opa.md), never written inline in the configuration file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from gateway.core.config_schema import problems

from .conftest import write

TOKEN = "siem-bearer-token-0b9d7c"


def _service(base: dict[str, Any], credentials: dict[str, Any]) -> dict[str, Any]:
    base.setdefault("opa", {})["services"] = {
        "siem": {"url": "https://logs.example.internal", "credentials": credentials}
    }
    return base


@pytest.mark.parametrize(
    ("credentials", "setting"),
    [
        ({"bearer": {"token": TOKEN}}, "opa.services.siem.credentials.bearer.token"),
        ({"oauth2": {"token_url": "https://idp/token", "client_id": "opa", "client_secret": TOKEN}}, "client_secret"),
        (
            {"oauth2": {"token_url": "https://idp/token", "client_id": "opa", "client_assertion": TOKEN}},
            "client_assertion",
        ),
        ({"client_tls": {"cert": "c.pem", "private_key": "k.pem", "private_key_passphrase": TOKEN}}, "passphrase"),
    ],
)
def test_an_inline_secret_is_refused_without_showing_it(
    base: dict[str, Any], credentials: dict[str, Any], setting: str
) -> None:
    found = problems(_service(base, credentials))
    assert len(found) == 1 and setting in found[0] and "expected {file: PATH} or {env: NAME}" in found[0], found
    assert TOKEN not in found[0]


@pytest.mark.parametrize(
    ("credentials", "named"),
    [
        ({"bearer": {"tokn": {"file": "secrets/siem"}}}, "tokn"),
        ({"bearer": {"token_paht": "/run/secrets/siem"}}, "token_paht"),
        ({"oauth2": {"token_url": "https://idp/token", "client_secert": {"env": "X"}}}, "client_secert"),
        ({"client_tls": {"cert": "c.pem", "private_kye": "k.pem"}}, "private_kye"),
    ],
)
def test_a_misspelled_credentials_field_is_refused(
    base: dict[str, Any], credentials: dict[str, Any], named: str
) -> None:
    found = problems(_service(base, credentials))
    assert any(named in line and "unknown setting" in line for line in found), found


@pytest.mark.parametrize(
    "credentials",
    [
        {"bearer": {"token": {"file": "secrets/siem"}, "scheme": "Bearer"}},
        {"bearer": {"token_path": "/run/secrets/siem"}},
        {
            "oauth2": {
                "token_url": "https://idp/token",
                "client_id": "opa",
                "client_secret": {"env": "SIEM_SECRET"},
                "scopes": ["logs"],
            }
        },
        {"client_tls": {"cert": "/etc/pvegate/c.pem", "private_key": "/etc/pvegate/k.pem"}},
    ],
)
def test_credentials_as_documented_load(base: dict[str, Any], tmp_path: Path, credentials: dict[str, Any]) -> None:
    (tmp_path / "secrets" / "siem").write_text(TOKEN + "\n")
    load(write(tmp_path, _service(base, credentials)))


def test_the_start_error_never_shows_an_inline_token(base: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, _service(base, {"bearer": {"token": TOKEN}})))
    assert TOKEN not in str(err.value)
