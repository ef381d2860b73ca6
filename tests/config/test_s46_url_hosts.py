"""URL settings that named no host, or a port out of range, loaded and then failed at run time.

An external `opa.url` of `http://` started a gateway whose every decision failed closed (a port
99999 got as far as opening the audit, then `cannot start: ValueError: Port out of range`); an
`auth.jwks_url` of `https://` or with port 99999 started a gateway that reported ready and refused
every token; an `auth.authorization_servers` entry of `https://` was advertised to every MCP
client as where to get a token. Each is refused when the file is read, as `public_url` and a cluster's `api_url`
already are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from tests.config.conftest import run_pvegate, write

TOKEN = {"env": "PVEGATE_S46_OPA_TOKEN"}


def _opa(c: dict[str, Any], url: str) -> None:
    c["opa"] = {"mode": "external", "url": url, "token": TOKEN}


def _as(c: dict[str, Any], url: str) -> None:
    c["auth"]["authorization_servers"] = ["https://idp.example.net/realms/ops", url]


def _jwks(c: dict[str, Any], url: str) -> None:
    c["auth"].update(jwks_url=url, algorithms=["HS256", "RS256"])


BAD = [
    (_opa, "http://", "opa.url: names no host"),
    (_opa, "http:///v1", "opa.url: names no host"),
    (_opa, "http://127.0.0.1:99999", "opa.url: the port in '127.0.0.1:99999' is not a number from 1 to 65535"),
    (_opa, "http://127.0.0.1:0", "opa.url: the port in '127.0.0.1:0' is not a number from 1 to 65535"),
    (_opa, "http://127.0.0.1:8181/?x=1", "opa.url: has a query or a fragment"),
    (_opa, "http://opa example:8181", "opa.url: 'http://opa example:8181' holds whitespace"),
    (_as, "https://", "auth.authorization_servers[1]: names no host"),
    (_as, "https://idp.example.net:99999", "auth.authorization_servers[1]: the port in 'idp.example.net:99999' is"),
    (_as, "https://idp.example.net/realms/ops?x", "auth.authorization_servers[1]: has a query or a fragment"),
    (_jwks, "https://", "auth.jwks_url: names no host"),
    (_jwks, "https://idp.example.net:99999/jwks", "auth.jwks_url: the port in 'idp.example.net:99999' is not a"),
    (_jwks, "https://idp.example.net:0/jwks", "auth.jwks_url: the port in 'idp.example.net:0' is not a"),
]


@pytest.mark.parametrize(("setting", "url", "message"), BAD)
def test_a_url_setting_without_a_usable_host_is_refused(
    base: dict[str, Any], tmp_path: Path, setting: Any, url: str, message: str
) -> None:
    setting(base, url)
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert line.startswith(message) and "\n" not in line, line


def test_config_check_says_so_with_its_finding_status(base: dict[str, Any], tmp_path: Path) -> None:
    _opa(base, "http://")
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1 and r.stderr == f"{path}: opa.url: names no host (scheme://HOST[:PORT]/...)\n", r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize(
    ("setting", "url"),
    [
        (_opa, "http://o"),
        (_opa, "http://127.0.0.1:8181"),
        (_opa, "https://opa.example.net:8443/behind/a/proxy/"),
        (_opa, "http://[::1]:8181"),
        (_as, "https://idp.example.net/realms/ops/"),
        (_as, "http://127.0.0.1:8080/realms/pvegate"),
        (_jwks, "https://idp.example.net/jwks"),
        (_jwks, "https://idp.example.net/realms/ops/protocol/openid-connect/certs"),
        (_jwks, "https://idp.example.net/keys?format=jwks"),  # fetched as given: a query is the server's own
        (_jwks, "http://127.0.0.1:8080/jwks"),
    ],
)
def test_the_url_forms_in_use_still_load(base: dict[str, Any], tmp_path: Path, setting: Any, url: str) -> None:
    setting(base, url)
    load(write(tmp_path, base))
