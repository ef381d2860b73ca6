"""`console.issuer` and `listen.host` written wrong were accepted by `pvegate config check`.

An issuer with no host, a port of 0 or 99999, or a query passed the check (the console's discovery is
ISSUER/.well-known/openid-configuration: every sign-in would fail later), as the other base URLs
(`public_url`, `opa.url`, ...) no longer do. A `listen.host` with a port in it (`localhost:8443`) passed
with TLS and was refused only by `serve` ("cannot resolve"), or was named a non-loopback address under
`tls.insecure_http`. Both are refused when the file is read, in one line naming the setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from tests.config.conftest import run_pvegate, write


def _console(c: dict[str, Any], issuer: str, *, enabled: bool = True) -> None:
    c["public_url"] = "https://127.0.0.1:8443"
    c["console"] = {
        "enabled": enabled,
        "issuer": issuer,
        "client_id": "pvegate-console",
        "session_key": {"file": "secrets/jwt"},
    }


BAD_ISSUERS = [
    ("https://", "console.issuer: names no host"),
    ("https:///realms/pvegate", "console.issuer: names no host"),
    ("https://idp.example.net:0/realms/x", "console.issuer: the port in 'idp.example.net:0' is not a number"),
    ("https://idp.example.net:99999/realms/x", "console.issuer: the port in 'idp.example.net:99999' is not a"),
    ("https://idp.example.net/realms/x?a=1", "console.issuer: has a query or a fragment"),
    ("https://idp.example.net/realms/x#f", "console.issuer: has a query or a fragment"),
]


@pytest.mark.parametrize(("issuer", "message"), BAD_ISSUERS)
@pytest.mark.parametrize("enabled", [True])  # a disabled console's issuer may be a placeholder (loads as before)
def test_a_console_issuer_without_a_usable_host_is_refused(
    base: dict[str, Any], tmp_path: Path, issuer: str, message: str, enabled: bool
) -> None:
    _console(base, issuer, enabled=enabled)
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert line.startswith(message) and "\n" not in line, line


def test_config_check_names_the_console_issuer(base: dict[str, Any], tmp_path: Path) -> None:
    _console(base, "https://idp.example.net:99999/realms/x")
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1, r
    assert r.stderr == (
        f"{path}: console.issuer: the port in 'idp.example.net:99999' is not a number from 1 to 65535\n"
    ), r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize(
    "issuer",
    [
        "https://idp.example.net/realms/ops",
        "https://idp.example.net/realms/ops/",
        "https://idp.example.net:8443/realms/ops",
        "http://127.0.0.1:8080/realms/pvegate",
        "http://[::1]:8080/realms/pvegate",
    ],
)
def test_a_good_console_issuer_still_loads(base: dict[str, Any], tmp_path: Path, issuer: str) -> None:
    _console(base, issuer)
    assert load(write(tmp_path, base)).console.issuer == issuer.rstrip("/")


BAD_HOSTS = [
    ("localhost:8443", True),
    ("localhost:8443", False),
    ("127.0.0.1:8443", False),
    ("[::1]:8443", False),
    ("[::1]", False),
    ("https://gw.example.net", False),
    ("gw example", False),
]


@pytest.mark.parametrize(("host", "insecure"), BAD_HOSTS)
def test_a_listen_host_with_a_port_or_a_url_is_refused(
    base: dict[str, Any], tmp_path: Path, host: str, insecure: bool
) -> None:
    base["listen"]["host"] = host
    if not insecure:
        base["tls"] = {"cert": "tls/cert.pem", "key": "tls/key.pem"}
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems  # not also "plain HTTP is only allowed on a loopback listen.host"
    assert line.startswith(f"listen.host: {host!r} is not") and "listen.port" in line and "\n" not in line, line


def test_config_check_says_a_host_with_a_port_is_wrong(base: dict[str, Any], tmp_path: Path) -> None:
    base["listen"]["host"] = "localhost:8443"
    base["tls"] = {"cert": "tls/cert.pem", "key": "tls/key.pem"}
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1 and r.stdout == "", r
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"{path}: listen.host: 'localhost:8443' is not"), line


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "::1", "::", "0.0.0.0", "localhost", "gw.example.net", "fe80::1", "2001:db8::5"]
)
def test_a_plain_host_or_ip_address_still_loads(base: dict[str, Any], tmp_path: Path, host: str) -> None:
    base["listen"]["host"] = host
    base["tls"] = {"cert": "tls/cert.pem", "key": "tls/key.pem"}
    assert load(write(tmp_path, base)).host == host


def test_a_disabled_consoles_placeholder_issuer_still_loads(base: dict[str, Any], tmp_path: Path) -> None:
    """A configuration that loaded before the check (a disabled console, its issuer not filled in yet)."""
    _console(base, "https://idp.example.net:99999/realms/x", enabled=False)
    load(write(tmp_path, base))
