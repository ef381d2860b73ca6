"""Settings the schema used to accept that the gateway could never use, refused when the file is read.

Each one passed `pvegate config check` and then failed later, or silently did nothing: a number so
large it overflowed at the first call (an SSH tool's `timeout` argument, stdio's readline limit), a
cluster name no tool call can name, a secret no accepted token is signed with, a CA file nothing is
verified against, a Host or Origin entry that can never equal the header it is compared with, and a
`$PVEGATE_OPA` that was passed over for another opa.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config_schema import problems, settings
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.config.conftest import PVEGATE, run_pvegate, write
from tests.support import free_port

# every number that feeds a timeout, a sleep, a size or a count: the largest the schema accepts
MAXIMA = {
    "clusters[].ssh.command_timeout": 86400,
    "clusters[].ssh.max_output_bytes": 67108864,
    "clusters[].ssh.max_sessions": 1000,
    "max_body_bytes": 67108864,
    "max_inflight_per_client": 100000,
    "max_inflight_per_principal": 100000,
    "refused_calls_per_minute_per_principal": 1000000,
    "target_cache_seconds": 3600,
    "tools_list_cache_seconds": 3600,
    "audit.retention_days": 36500,
    "audit.min_free_mb": 1099511627776,
    "audit.auth_failure_rows_per_minute": 1000000,
    "opa.bundles.<name>.polling.min_delay_seconds": 86400,
    "opa.bundles.<name>.polling.max_delay_seconds": 86400,
    "opa.bundles.<name>.polling.long_polling_timeout_seconds": 3600,
    "opa.bundles.<name>.size_limit_bytes": 4294967296,
}


def test_every_number_has_a_maximum() -> None:
    numbers = {
        path: node
        for path, node in settings()
        if {"integer", "number"} & set(node["type"] if isinstance(node.get("type"), list) else [node.get("type")])
    }
    assert [p for p, node in numbers.items() if "maximum" not in node] == []
    assert {p: numbers[p]["maximum"] for p in MAXIMA} == MAXIMA


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            lambda c: c["clusters"][0].update(ssh={"key_file": "k", "command_timeout": 1e308}),
            "clusters.default.ssh.command_timeout: must be at most 86400, got 1e+308",
        ),
        (
            lambda c: c["clusters"][0].update(ssh={"key_file": "k", "max_output_bytes": 10**30}),
            "clusters.default.ssh.max_output_bytes: must be at most 67108864, got 1000000000000000000000000000000",
        ),
        (lambda c: c.update(max_body_bytes=10**30), "max_body_bytes: must be at most 67108864, got 10000"),
        (lambda c: c.update(max_inflight_per_client=10**30), "max_inflight_per_client: must be at most 100000"),
        (lambda c: c.update(target_cache_seconds=1e308), "target_cache_seconds: must be at most 3600, got 1e+308"),
        (lambda c: c.update(tools_list_cache_seconds=1e308), "tools_list_cache_seconds: must be at most 3600"),
        (lambda c: c.update(audit={"retention_days": 1e308}), "audit.retention_days: must be at most 36500"),
        (lambda c: c.update(audit={"min_free_mb": 1e308}), "audit.min_free_mb: must be at most 1099511627776"),
    ],
)
def test_a_number_too_large_to_use_is_refused(base: dict[str, Any], change: Any, line: str) -> None:
    change(base)
    (found,) = problems(base)
    assert found.startswith(line), found


@pytest.mark.parametrize("name", ["Lab_2", "Prod", "prod.eu", "1lab", "-lab", "a" * 33])
def test_a_cluster_name_no_tool_call_can_name_is_refused(base: dict[str, Any], name: str) -> None:
    """A tool's `cluster` argument takes ^[a-z][a-z0-9-]{0,31}$ (tools/catalog.py CLUSTER_PARAM)."""
    base["clusters"][0]["name"] = name
    (found,) = problems(base)
    assert "name: expected a name of lowercase letters, digits and '-' that starts with a letter" in found, found
    assert found.endswith(f"got {name!r}"), found


@pytest.mark.parametrize("name", ["lab-2", "prod", "a" * 32, "x"])
def test_a_cluster_name_a_tool_call_can_name_is_accepted(base: dict[str, Any], name: str) -> None:
    base["clusters"][0]["name"] = name
    assert problems(base) == []


def test_the_cluster_name_pattern_is_the_tools_cluster_argument() -> None:
    from gateway.tools.catalog import CLUSTER_PARAM

    (name,) = (node for path, node in settings() if path == "clusters[].name")
    assert name["pattern"] == CLUSTER_PARAM["pattern"]


def test_an_hs256_secret_without_hs256_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    """`pvegate token mint` signed tokens with it that every request then refused."""
    (tmp_path / "jwks.json").write_text('{"keys": []}')
    base["auth"].update(algorithms=["RS256"], jwks_file="jwks.json")
    assert problems(base) == [
        "auth.hs256_secret: not used when auth.algorithms does not list HS256 (tokens signed with it would be "
        "refused); add HS256 to auth.algorithms or remove the secret"
    ]
    base["auth"]["algorithms"] = ["RS256", "HS256"]
    assert problems(base) == []


def test_a_ca_file_with_verify_tls_false_is_refused(base: dict[str, Any]) -> None:
    base["clusters"][0].update(ca_file="ca.pem", verify_tls=False)
    assert problems(base) == [
        "clusters.default.ca_file: not used when clusters.default.verify_tls is false; give one of them"
    ]


@pytest.mark.parametrize(
    "entry", ["*", "https://gw.example:8443/", "gw.example/mcp", "::1", "gw.example:0", "a b", "*.example"]
)
def test_an_allowed_host_that_never_matches_is_refused(base: dict[str, Any], entry: str) -> None:
    base["allowed_hosts"] = ["gw.example", entry]
    (found,) = problems(base)
    assert found.startswith("allowed_hosts[1]: ") and "never matches a Host header" in found, found


@pytest.mark.parametrize(
    "entry",
    ["*", "app.example", "https://app.example/ui", "https://*.example", "ftp://app.example", "https://app.example?x"],
)
def test_an_allowed_origin_that_never_matches_is_refused(base: dict[str, Any], entry: str) -> None:
    base["allowed_origins"] = ["https://app.example", entry]
    (found,) = problems(base)
    assert found.startswith("allowed_origins[1]: ") and "never matches an Origin header" in found, found


@pytest.mark.parametrize(
    ("entry", "bare"), [("https://app.example:443", "https://app.example"), ("http://a:80", "http://a")]
)
def test_an_allowed_origin_with_the_default_port_says_to_drop_it(base: dict[str, Any], entry: str, bare: str) -> None:
    base["allowed_origins"] = [entry]
    port = entry.rsplit(":", 1)[1]
    assert problems(base) == [
        f"allowed_origins[0]: {entry!r} never matches: browsers send no default port; drop ':{port}' ({bare})"
    ]


def test_hosts_and_origins_in_their_usable_forms_are_accepted(base: dict[str, Any]) -> None:
    base["allowed_hosts"] = ["gw.example", "gw.example:8443", "127.0.0.1:8443", "[::1]:8443", "GW.Example."]
    base["allowed_origins"] = ["https://app.example", "https://app.example:8443", "http://127.0.0.1:3000/"]
    assert problems(base) == []


@pytest.mark.parametrize("change", ["command_timeout", "max_body_bytes", "cluster_name", "hs256", "origin"])
def test_config_check_and_serve_refuse_in_one_line(base: dict[str, Any], tmp_path: Path, change: str) -> None:
    """The setting named, no traceback (`config check` exits 1, its finding; `serve` 2): before, `config check`
    said OK and the gateway started."""
    if change == "command_timeout":
        base["clusters"][0]["ssh"] = {"key_file": "k", "command_timeout": 1e308}
    elif change == "max_body_bytes":
        base["max_body_bytes"] = 10**30
    elif change == "cluster_name":
        base["clusters"][0]["name"] = "Lab_2"
    elif change == "hs256":
        (tmp_path / "jwks.json").write_text('{"keys": []}')
        base["auth"].update(algorithms=["RS256"], jwks_file="jwks.json")
    else:
        base["allowed_origins"] = ["https://app.example:443"]
    base["listen"]["port"] = free_port()
    path = write(tmp_path, base)
    for args, status in ((("config", "check", str(path)), 1), (("serve", "--config", str(path)), 2)):
        r = run_pvegate(*args)
        assert r.returncode == status, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and f"{path}: " in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()


def test_a_pvegate_opa_that_is_not_there_refuses_the_start(base: dict[str, Any], tmp_path: Path) -> None:
    """It was passed over for the checkout's .tools/bin/opa or PATH's, while opa.binary was refused."""
    base["listen"]["port"] = free_port()  # the old code started a gateway: not on a port other tests use
    path = write(tmp_path, base)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PVEGATE_")}
    for named in (tmp_path / "nope" / "opa", path):  # missing; a file that is not executable
        with subprocess.Popen(
            [*PVEGATE, "serve", "--config", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env={**env, "PVEGATE_OPA": str(named)},
        ) as proc:
            try:
                _, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)  # it started with another opa: stop it (and that OPA) cleanly
                proc.communicate(timeout=60)
                pytest.fail(f"PVEGATE_OPA={named} was passed over: the gateway started with another opa")
        assert proc.returncode == 2, stderr
        assert "Traceback" not in stderr and "starting OPA sidecar" not in stderr, stderr
        assert (
            stderr.strip().splitlines()[-1] == f"pvegate: cannot start: PVEGATE_OPA {named} is not an executable file"
        )
