"""Mistakes YAML or JSON Schema let through on their own: a key given twice, a non-finite number;
and a URL's password, which no problem message may show."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load, parse
from gateway.core.config_schema import problems, redact
from tests.config.conftest import write

# -- a key given twice ----------------------------------------------------------------------


def test_a_section_given_twice_is_refused_not_replaced(base: dict[str, Any], tmp_path: Path) -> None:
    """The bug: the second `opa:` replaced the first, the signed bundle vanished and `config check` said OK."""
    path = write(tmp_path, base)
    path.write_text(
        path.read_text()
        + "opa:\n  bundle: b.tar.gz\n  verification_key: k.pem\n"
        + "health: {opa_probe_interval: 2}\n"
        + "opa:\n  policies: [p]\n"
    )
    lines = path.read_text().splitlines()
    first, second = (i + 1 for i, line in enumerate(lines) if line == "opa:")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert err.value.problems == (
        f"opa: given twice in the same mapping (lines {first} and {second}); "
        "the second would silently replace the first: keep one",
    )
    assert err.value.source == path


def test_every_key_given_twice_is_listed_at_any_depth(base: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "pvegate.yaml"
    path.write_text(
        "tls: {insecure_http: true, insecure_http: false}\n"  # a flow mapping too
        "clusters:\n"
        "  - name: default\n"
        "    api_url: https://127.0.0.1:9/api2/json\n"
        "    verify_tls: true\n"
        "    token: {file: secrets/pve-token}\n"
        "    verify_tls: false\n"
    )
    with pytest.raises(ConfigError) as err:
        load(path)
    assert err.value.problems == (
        "insecure_http: given twice in the same mapping (lines 1 and 1); "
        "the second would silently replace the first: keep one",
        "verify_tls: given twice in the same mapping (lines 5 and 7); "
        "the second would silently replace the first: keep one",
    )


def test_a_merge_key_may_still_be_overridden(base: dict[str, Any], tmp_path: Path) -> None:
    """`<<: *anchor` then a key of its own is YAML's way to override, not a key given twice."""
    api_url = base["clusters"][0]["api_url"]
    del base["clusters"]
    path = write(tmp_path, base)
    path.write_text(
        path.read_text()
        + "clusters:\n"
        + f"  - <<: &common {{timeout: 5, api_url: '{api_url}', token: {{file: secrets/pve-token}}}}\n"
        + "    name: a\n"
        + "  - <<: *common\n    name: b\n    timeout: 7\n"
    )
    cfg = load(path)
    assert (cfg.clusters["a"].timeout, cfg.clusters["b"].timeout) == (5, 7)


def test_a_merge_pyyaml_reads_wrongly_is_refused_with_what_to_do(base: dict[str, Any], tmp_path: Path) -> None:
    """A cluster merging defaults that themselves merge and override a key: PyYAML takes the inner
    value, not the override. The old loader also misreported it as a key given twice."""
    api_url = base["clusters"][0]["api_url"]
    del base["clusters"]
    path = write(tmp_path, base)
    path.write_text(
        path.read_text()
        + "defaults:\n"
        + f"  base: &base {{timeout: 5, api_url: '{api_url}', token: {{file: secrets/pve-token}}}}\n"
        + "  slow: &slow {<<: *base, timeout: 30}\n"
        + "clusters:\n  - {<<: *slow, name: a}\n"
    )
    with pytest.raises(ConfigError) as err:
        load(path)
    [problem] = err.value.problems
    assert "merges a mapping" in problem and "overrides timeout" in problem and "given twice" not in problem


# -- non-finite numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_value", "setting"),
    [
        (".nan", "health.opa_probe_interval"),  # readiness stayed red for ever
        (".inf", "health.audit_probe_interval"),  # above the maximum: the finite message, not a range one
        (".nan", "audit.min_free_mb"),  # serve crashed on int(nan)
        ("-.inf", "audit.min_free_mb"),
        (".inf", "shutdown_grace_seconds"),  # SIGTERM waited for ever
        (".nan", "shutdown_grace_seconds"),
        (".nan", "clusters.default.timeout"),
        (".inf", "target_cache_seconds"),
        (".nan", "audit.retention_days"),
    ],
)
def test_a_non_finite_number_is_refused(base: dict[str, Any], tmp_path: Path, yaml_value: str, setting: str) -> None:
    *sections, key = setting.split(".")
    node: Any = base
    for part in sections:
        node = node["clusters"][0] if part == "clusters" else node if part == "default" else node.setdefault(part, {})
    node[key] = "VALUE"
    path = write(tmp_path, base)
    path.write_text(path.read_text().replace("VALUE", yaml_value))
    with pytest.raises(ConfigError) as err:
        load(path)
    assert err.value.problems == (f"{setting}: must be a finite number, got {yaml_value}",)


def test_a_non_finite_number_is_refused_in_passed_through_sections_too(base: dict[str, Any]) -> None:
    # OPA's sections, in a list item too (oauth2's open `additional_claims` is refused since)
    oauth2 = {"token_url": "https://idp/t", "client_id": "c", "client_secret": {"env": "S"}, "scopes": ["a", math.nan]}
    base["opa"] = {
        "services": {"s": {"url": "https://s", "credentials": {"oauth2": oauth2}}},
        "decision_logs_upload": {"service": "s", "reporting": {"upload_size_limit_bytes": math.inf}},
    }
    assert sorted(problems(base)) == [
        "opa.decision_logs_upload.reporting.upload_size_limit_bytes: expected an integer, got .inf",
        "opa.services.s.credentials.oauth2.scopes[1]: expected a string, got .nan",
    ]


def test_a_non_finite_number_where_another_type_is_expected_says_which(base: dict[str, Any]) -> None:
    base["listen"]["port"] = math.inf
    base["auth"]["audience"] = math.nan
    base["log_format"] = math.nan
    assert problems(base) == [
        "listen.port: expected an integer, got .inf",
        "auth.audience: expected a string, got .nan",
        "log_format: expected one of text, json, got .nan",
    ]


def test_parse_refuses_a_non_finite_number_too(base: dict[str, Any], tmp_path: Path) -> None:
    base["health"] = {"cluster_probe_interval": math.nan}
    with pytest.raises(ConfigError, match=r"health\.cluster_probe_interval: must be a finite number"):
        parse(base, tmp_path)


# -- a URL's password -----------------------------------------------------------------------

PASSWORD = "S3cretPassw0rd"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql+asyncpg://pvegate:{PASSWORD}@db.example:5432/pvegate", "postgresql+asyncpg://***@db.example"),
        (f"mysql://pvegate:{PASSWORD}@db.example/pvegate", "mysql://***@db.example/pvegate"),
        (f"pg://pvegate:{PASSWORD}@", "pg://***@"),
    ],
)
def test_a_storage_url_problem_never_shows_the_password(base: dict[str, Any], url: str, shown: str) -> None:
    base["storage"] = {"url": url}
    (line,) = problems(base)
    assert line.startswith("storage.url: expected sqlite://PATH or postgresql://USER@HOST:PORT/DATABASE, got "), line
    assert shown in line and PASSWORD not in line and "pvegate:" not in line, line


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://pvegate:S3cret/Passw0rd@db.example/pvegate",  # urlsplit: the port would be 'S3cret'
        "postgresql://pvegate:S3cret?Passw0rd@db.example/pvegate",
        "postgresql://pvegate:S3cret#Passw0rd@db.example/pvegate",
        "postgresql://pvegate:1234/S3cretPassw0rd@db.example/pvegate",  # a number before the '/': a valid port
        "postgresql://pvegate:S3cret[Passw0rd@db.example/pvegate",  # urlsplit: invalid IPv6 URL
        "postgresql://pvegate:S3cret\uff03Passw0rd@db.example/pvegate",  # urlsplit quotes the netloc (NFKC)
    ],
)
def test_a_password_urlsplit_cannot_separate_is_neither_accepted_nor_shown(
    base: dict[str, Any], tmp_path: Path, url: str
) -> None:
    base["storage"] = {"url": url}
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert line.startswith("storage.url: "), line
    assert "S3cret" not in line and "Passw0rd" not in line, line


def test_a_console_issuer_urlsplit_refuses_is_not_quoted(base: dict[str, Any], tmp_path: Path) -> None:
    base["public_url"] = "https://gw.example"
    base["console"] = {
        "enabled": True,
        "issuer": "https://admin:S3cret\uff03Passw0rd@idp.example/realms/x",
        "client_id": "pvegate",
        "session_key": {"file": "secrets/jwt"},
    }
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    assert err.value.problems == ("console.issuer: not a valid URL: characters a host name cannot hold",)


def test_the_password_refusal_does_not_show_it(base: dict[str, Any], tmp_path: Path) -> None:
    base["storage"] = {"url": f"postgresql://pvegate:{PASSWORD}@db.example/pvegate"}
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert line.startswith("storage.url: holds a password; ") and PASSWORD not in line, line


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        (lambda c, u: c.update(public_url=u), "public_url"),
        (lambda c, u: c["auth"].update(jwks_url=u), "auth.jwks_url"),
        (lambda c, u: c.update(opa={"mode": "external", "token": {"env": "T"}, "url": u}), "opa.url"),
        (lambda c, u: c["clusters"][0].update(api_url=u), "clusters.default.api_url"),
        (lambda c, u: c["clusters"][0].update(fingerprint=u), "clusters.default.fingerprint"),
        (lambda c, u: c.update(log_format=u), "log_format"),
        (lambda c, u: c.update(local_principals={u: {}}), "local_principals"),
    ],
)
def test_no_problem_shows_a_urls_password(base: dict[str, Any], change: Any, setting: str) -> None:
    change(base, f"ftp://admin:{PASSWORD}@host.example/x")
    (line,) = problems(base)
    assert line.startswith(f"{setting}: ") and PASSWORD not in line and "admin" not in line, line


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://u:p@h/x", "https://***@h/x"),
        ("got 'https://u:p@h/x' and 'http://h2'", "got 'https://***@h/x' and 'http://h2'"),
        ("https://u:p/q@h/x", "https://***@h/x"),  # everything up to the last '@': the password may hold a '/'
        ("https://h/x", "https://h/x"),
        ("no URL: a@b", "no URL: a@b"),
        ("expected postgresql://USER@HOST:PORT/DATABASE", "expected postgresql://USER@HOST:PORT/DATABASE"),
        ("postgresql://USER:pw@h", "postgresql://***@h"),
    ],
)
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_a_number_too_large_for_a_float_is_refused_not_a_crash(base: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, base)
    path.write_text(path.read_text() + f"shutdown_grace_seconds: {10**400}\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert any(p.startswith("shutdown_grace_seconds:") for p in err.value.problems), err.value.problems
    base["shutdown_grace_seconds"] = 1e300  # finite, but SIGTERM would wait for ever
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    assert any("shutdown_grace_seconds" in p for p in err.value.problems), err.value.problems


def test_a_merge_list_whose_mappings_share_a_key_is_refused(base: dict[str, Any], tmp_path: Path) -> None:
    """`<<: [*strict, *lax]`: YAML 1.1 says strict's verify_tls wins, PyYAML 6.0.x read lax's (false)
    while `config check` said OK."""
    api_url = base["clusters"][0]["api_url"]
    del base["clusters"]
    path = write(tmp_path, base)
    path.write_text(
        path.read_text()
        + "defaults:\n"
        + f"  strict: &strict {{verify_tls: true, api_url: '{api_url}', token: {{file: secrets/pve-token}}}}\n"
        + "  lax: &lax {verify_tls: false, timeout: 30}\n"
        + "clusters:\n  - {<<: [*strict, *lax], name: a}\n"
    )
    with pytest.raises(ConfigError) as err:
        load(path)
    [problem] = err.value.problems
    assert "merges mappings that both give verify_tls" in problem, problem
