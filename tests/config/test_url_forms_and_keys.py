"""URL settings and mapping keys that loaded and then failed, refused when the file is read.

A cluster's `api_url` without `/api2/json` (every call then answered 404), with a port out of
range, a query or a space; a `public_url` that is the MCP endpoint (OAuth discovery then points at
`/mcp/mcp`) or has no host; an `auth.jwks_url` over plain http that only `pvegate serve` refused; a
name YAML 1.1 reads as a boolean or a number (`on:` became the principal "True"); and an enabled
console whose scopes lack `openid` (every sign-in failed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.auth.jwks import JwksKeys
from gateway.core.config import ConfigError, load
from gateway.core.config_schema import problems
from gateway.mcp.wellknown import resource_url
from tests.config.conftest import run_pvegate, write
from tests.console.test_config import console

API = "clusters.default.api_url: "


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://127.0.0.1:33059", "its path must be /api2/json, the Proxmox API's base"),
        ("https://127.0.0.1:33059/", "did you mean https://127.0.0.1:33059/api2/json?"),
        ("https://pve1.example.net:8006/pve/api2/json", "got the path '/pve/api2/json'"),
        ("https://127.0.0.1:80060/api2/json", "the port in '127.0.0.1:80060' is not a number from 1 to 65535"),
        ("https://127.0.0.1:0/api2/json", "is not a number from 1 to 65535"),
        ("https://pve1:x/api2/json", "is not a number from 1 to 65535"),
        ("https:///api2/json", "names no host"),
        ("https://", "names no host"),
        ("https://pve1.example.net:8006/api2/json?x", "has a query or a fragment"),
        ("https://pve1.example.net:8006/api2/json#top", "has a query or a fragment"),
        ("https://pve1 example.net:8006/api2/json", "holds whitespace"),
        ("https://pve1.example.net:8006/api2/json\n", "holds whitespace"),
        ("https://[zz]:8006/api2/json", "is not a URL"),
        ("https://pve1.ex%41mple.net/api2/json", "is not host or host:port"),
    ],
)
def test_an_api_url_the_runtime_cannot_call_is_refused(
    base: dict[str, Any], tmp_path: Path, url: str, message: str
) -> None:
    """The runtime appends each call's path (/nodes/...) to api_url: anything but HOST[:PORT]/api2/json fails."""
    base["clusters"][0]["api_url"] = url
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert line.startswith(API) and message in line and "\n" not in line, line


def test_an_api_url_with_a_password_is_said_once(base: dict[str, Any]) -> None:
    base["clusters"][0]["api_url"] = "https://root:pw@pve.example:8006"
    (line,) = problems(base)
    assert line.startswith(f"{API}a user name or password in the URL") and "pw" not in line, line


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:9/api2/json",
        "https://127.0.0.1:9/api2/json/",
        "https://pve1.example.net/api2/json",
        "https://[::1]:8006/api2/json",
        "http://localhost:8006/api2/json",
        "https://pve_1.lab.:65535/api2/json",
        "https://pvé.example/api2/json",  # yarl sends its IDNA form
    ],
)
def test_the_api_url_forms_in_use_still_load(base: dict[str, Any], tmp_path: Path, url: str) -> None:
    """The simulator's, the docs' and the tests' form: HOST[:PORT]/api2/json, a trailing '/' aside."""
    base["clusters"][0]["api_url"] = url
    assert load(write(tmp_path, base)).clusters["default"].api_url == url.rstrip("/")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "http://127.0.0.1:18743/mcp",
            "public_url: is the gateway's base URL, without /mcp (the MCP endpoint is public_url + /mcp); "
            "did you mean http://127.0.0.1:18743?",
        ),
        ("https://gw.example.net/pvegate/mcp/", "did you mean https://gw.example.net/pvegate?"),
        ("https://", "public_url: names no host"),
        ("https://gw example", "public_url: 'https://gw example' holds whitespace"),
        ("https://gw.example.net:99999", "public_url: the port in 'gw.example.net:99999' is not a number"),
        ("https://gw.example.net/?next=1", "public_url: has a query or a fragment"),
    ],
)
def test_a_public_url_that_is_no_base_url_is_refused(
    base: dict[str, Any], tmp_path: Path, url: str, message: str
) -> None:
    base["public_url"] = url
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert message in line, line


@pytest.mark.parametrize(
    ("url", "resource"),
    [
        ("https://gw.example.net", "https://gw.example.net/mcp"),
        ("https://gw.example.net:8443/", "https://gw.example.net:8443/mcp"),
        ("https://proxy.example.net/pvegate", "https://proxy.example.net/pvegate/mcp"),  # a path prefix
        ("https://proxy.example.net/mcp-gw/", "https://proxy.example.net/mcp-gw/mcp"),
    ],
)
def test_a_public_base_url_still_loads(base: dict[str, Any], tmp_path: Path, url: str, resource: str) -> None:
    base["public_url"] = url
    assert resource_url(load(write(tmp_path, base))) == resource


JWKS_URLS = [
    "http://idp.example.net/jwks",
    "http://127.0.0.2:8080/jwks",  # loopback, but not one of the fetcher's three
    "http://127.0.0.1:8080/realms/ops/protocol/openid-connect/certs",
    "http://localhost:8080/jwks",
    "http://[::1]:8080/jwks",
    "https://idp.example.net/jwks",
]


@pytest.mark.parametrize("url", JWKS_URLS)
def test_config_loading_refuses_the_jwks_url_the_fetcher_refuses(base: dict[str, Any], url: str) -> None:
    """The same rule as gateway/auth/jwks.py, which `pvegate serve` applied alone."""
    base["auth"].update(jwks_url=url, algorithms=["HS256", "RS256"])
    try:
        JwksKeys(url=url)
        fetcher_refuses = False
    except ValueError:
        fetcher_refuses = True
    found = problems(base)
    assert found == (
        [
            "auth.jwks_url: must be https (plain http only on loopback: 127.0.0.1, localhost or ::1); "
            "the keys that verify every token must not cross the network in the clear"
        ]
        if fetcher_refuses
        else []
    )
    assert fetcher_refuses == url.startswith(("http://idp", "http://127.0.0.2"))


def test_config_check_refuses_a_plain_http_jwks_url(base: dict[str, Any], tmp_path: Path) -> None:
    base["auth"].update(jwks_url="http://idp.example.net/jwks", algorithms=["HS256", "RS256"])
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1, r.stdout
    assert r.stderr.startswith(f"{path}: auth.jwks_url: must be https (plain http only on loopback"), r.stderr


NODE = {"host": "10.0.0.1", "host_key": "ssh-ed25519 AAAA"}


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (
            lambda c: c.update(local_principals={"KEY": {"roles": ["operator"]}, "ci-bot": {}}),
            "on",
            "local_principals: the key true is not a string (YAML reads an unquoted yes, no, on, off, true or "
            "false as a boolean); quote it as written, e.g. 'on':",
        ),
        (
            lambda c: c.update(local_principals={"KEY": {}}),
            "1",
            "local_principals: the key 1 is not a string (YAML reads it as a number); quote it as written, e.g. '1':",
        ),
        (
            lambda c: c["clusters"][0].update(ssh={"key_file": "id", "nodes": {"KEY": NODE}}),
            "1",
            "clusters.default.ssh.nodes: the key 1 is not a string (YAML reads it as a number)",
        ),
        (
            lambda c: c.update(opa={"services": {"KEY": {"url": "https://b.example"}}}),
            "2",
            "opa.services: the key 2 is not a string",
        ),
        (
            lambda c: c["auth"].update(kind={"claim": "k", "values": {"KEY": "human"}}),
            "yes",
            "auth.kind.values: the key true is not a string",
        ),
        (lambda c: c["tls"].update(KEY=1), "off", "tls: the key false is not a string"),
    ],
)
def test_a_key_yaml_reads_as_a_boolean_or_a_number_is_refused(
    base: dict[str, Any], tmp_path: Path, change: Any, key: str, message: str
) -> None:
    """YAML 1.1 reads `on:` as true and `1:` as 1: the principal became "True", the node kept the number."""
    change(base)
    path = write(tmp_path, base)
    path.write_text(path.read_text().replace("KEY:", f"{key}:"))
    with pytest.raises(ConfigError) as err:
        load(path)
    (line,) = err.value.problems
    assert line.startswith(message), line


def test_a_quoted_name_keeps_its_spelling(base: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, base)
    path.write_text(path.read_text() + "local_principals:\n  'on': {roles: [operator]}\n  '1': {}\n")
    assert sorted(load(path).local_principals) == ["1", "on"]


def test_an_enabled_console_without_the_openid_scope_is_refused(tmp_path: Path) -> None:
    """The sign-in reads the ID token, which the provider only sends for `openid` (admin/console/oidc.py)."""
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, console(tmp_path, scopes=["profile", "email"])))
    assert err.value.problems == (
        "console.scopes: must include openid while the console is enabled (without it the identity provider "
        "sends no ID token, and every sign-in fails)",
    )


@pytest.mark.parametrize(
    "over", [{"scopes": ["openid"]}, {}, {"enabled": False, "scopes": ["profile"]}], ids=["openid", "default", "off"]
)
def test_console_scopes_with_openid_or_a_disabled_console_load(tmp_path: Path, over: dict[str, Any]) -> None:
    cfg = load(write(tmp_path, console(tmp_path, **over))).console
    assert cfg.enabled == over.get("enabled", True)
