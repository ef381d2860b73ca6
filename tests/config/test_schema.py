"""The configuration schema refuses mistakes and says where they are."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.auth.jwks import ALG_KEY_TYPES
from gateway.core import config as config_module
from gateway.core.config import Config, ConfigError, load, parse
from gateway.core.config_schema import problems, schema, settings
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.config.conftest import minimal, write

TOKEN = {"env": "PVEGATE_OPA_TOKEN"}  # opa.token, required with opa.mode external


def test_minimal_config_is_valid(base: dict[str, Any], tmp_path: Path) -> None:
    assert problems(base) == []
    cfg = load(write(tmp_path, base))
    assert cfg.clusters["default"].token.read().startswith("pvegate@pve!")


def test_typo_is_refused_with_the_nearest_key(base: dict[str, Any], tmp_path: Path) -> None:
    """The bug this exists for: `role_claim` used to start a gateway that gave every agent zero tools."""
    base["auth"]["role_claim"] = "realm_access.roles"
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    assert err.value.problems == ("auth.role_claim: unknown setting; did you mean auth.roles_claim?",)
    assert err.value.source == tmp_path / "pvegate.yaml"


def test_wrong_type_names_the_cluster_and_the_value(base: dict[str, Any]) -> None:
    base["clusters"][0]["timeout"] = "ten"
    assert problems(base) == ["clusters.default.timeout: expected a number, got 'ten'"]


def test_every_problem_is_listed_in_file_order(base: dict[str, Any]) -> None:
    base["listen"]["port"] = "8443"  # a string, not a port
    base["opa"] = {"mode": "manged", "timeout_ms": 0}
    base["clusters"][0]["ssh"] = {"key_file": "k", "nodes": {"pve1": {"host": "h", "hostkey": "ssh-ed25519 AAAA"}}}
    base["target_cache_second"] = 3  # opa and this come after clusters in the file (insertion order)
    assert problems(base) == [
        "listen.port: expected an integer, got '8443'",
        "clusters.default.ssh.nodes.pve1.hostkey: unknown setting; "
        "did you mean clusters.default.ssh.nodes.pve1.host_key?",
        "clusters.default.ssh.nodes.pve1.host_key: required setting is missing",
        "opa.mode: expected one of managed, external, got 'manged'; did you mean managed?",
        "opa.timeout_ms: must be at least 1, got 0",
        "target_cache_second: unknown setting; did you mean target_cache_seconds?",
    ]


def test_a_setting_in_the_wrong_section_points_to_the_right_one(base: dict[str, Any]) -> None:
    base["roles_claim"] = "roles"
    base["clusters"][0]["command_timeout"] = 5
    base["timeout"] = 5
    assert problems(base) == [
        "clusters.default.command_timeout: unknown setting; did you mean clusters.default.ssh.command_timeout?",
        "roles_claim: unknown setting; did you mean auth.roles_claim?",
        "timeout: unknown setting; did you mean clusters.<name>.timeout?",
    ]


def test_unknown_key_without_a_near_one_lists_the_known_ones(base: dict[str, Any]) -> None:
    base["admin"] = {"tokenz_for_everyone": {"file": "x"}}
    (line,) = problems(base)
    assert line.startswith("admin.tokenz_for_everyone: unknown setting")
    base["admin"] = {"xyzzy": 1}
    assert problems(base) == ["admin.xyzzy: unknown setting (settings here: token)"]


def test_clusters_without_a_usable_name_are_shown_by_index(base: dict[str, Any]) -> None:
    second = copy.deepcopy(base["clusters"][0])
    del second["name"]
    second["verify_tls"] = "no"
    base["clusters"].append(second)
    assert problems(base) == [  # a missing setting is listed after those present
        "clusters[1].verify_tls: expected true or false, got 'no'",
        "clusters[1].name: required setting is missing",
    ]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c["auth"].update(hs256_secret="/etc/secret"), "auth.hs256_secret: expected {file: PATH} or"),
        (lambda c: c["auth"].update(hs256_secret={"file": "a", "env": "B"}), "auth.hs256_secret: expected exactly one"),
        (lambda c: c["auth"].update(hs256_secret={}), "auth.hs256_secret: expected exactly one of file: or env:"),
        (lambda c: c["auth"].update(algorithms=["HS256", "RS257"]), "auth.algorithms[1]: expected one of HS256,"),
        (lambda c: c["auth"].update(algorithms=["HS256", "HS256"]), "auth.algorithms: lists the same value twice"),
        (lambda c: c.pop("auth"), "auth: required setting is missing"),
        (lambda c: c["clusters"].clear(), "clusters: must list at least 1 entry"),
        (lambda c: c.update(clusters={"default": {}}), "clusters: expected a list, got a mapping"),
        (lambda c: c["clusters"][0].update(api_url="ftp://x"), "clusters.default.api_url: expected an http:// or"),
        # the API token would cross the network in the clear (loopback stays allowed: a local proxy, tests)
        (
            lambda c: c["clusters"][0].update(api_url="http://pve1.example.net:8006/api2/json"),
            "clusters.default.api_url: plain http:// to another host would send the Proxmox API token in the clear",
        ),
        (lambda c: c["clusters"][0].update(fingerprint="AB"), "clusters.default.fingerprint: expected a SHA-256"),
        (lambda c: c["clusters"][0].update(timeout=0), "clusters.default.timeout: must be greater than 0, got 0"),
        (lambda c: c["listen"].update(port=70000), "listen.port: must be at most 65535, got 70000"),
        (lambda c: c.update(max_body_bytes=True), "max_body_bytes: expected an integer, got true"),
        (lambda c: c.update(tools_list_cache_seconds=None), "tools_list_cache_seconds: expected a number, got nothing"),
        (lambda c: c.update(listen=None), "listen: expected a mapping, got nothing (null)"),
        (lambda c: c.update(audit={"retention_days": 0}), "audit.retention_days: must be greater than 0, got 0"),
        (lambda c: c.update(allowed_origins="https://a"), "allowed_origins: expected a list, got 'https://a'"),
    ],
)
def test_value_problems(base: dict[str, Any], change: Any, expected: str) -> None:
    change(base)
    found = problems(base)
    assert len(found) == 1 and found[0].startswith(expected), found


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c["clusters"].append(copy.deepcopy(c["clusters"][0])), "clusters[1].name: cluster 'default' is"),
        (lambda c: c.update(opa={"mode": "external", "token": TOKEN}), "opa.url: required when opa.mode is external"),
        (lambda c: c.update(opa={"mode": "external", "url": "http://o"}), "opa.token: required when opa.mode is"),
        (lambda c: c.update(opa={"url": "http://127.0.0.1:8181"}), "opa.url: only used when opa.mode is external"),
        (lambda c: c.update(opa={"token": TOKEN}), "opa.token: only used when opa.mode is"),
        (
            lambda c: c.update(opa={"mode": "external", "url": "http://o", "token": TOKEN, "bundle": "b"}),
            "opa.bundle: only used",
        ),
        (
            lambda c: c.update(opa={"bundle": "b", "verification_key": "k", "policies": ["p"]}),
            "opa.policies: not used when opa.bundle",
        ),
        # an unsigned bundle: anyone who can change the file, or answer for the service, decides every call
        (lambda c: c.update(opa={"bundle": "b"}), "opa.verification_key: required with opa.bundle"),
        (
            lambda c: c.update(opa={"services": {"s": {"url": "https://s"}}, "bundles": {"p": {"service": "s"}}}),
            "opa.bundles.p.signing.keyid: required",
        ),
        (
            lambda c: c.update(
                opa={
                    "services": {"s": {"url": "https://s"}},
                    "bundles": {"p": {"service": "s", "signing": {"keyid": "k"}}},
                }
            ),
            "opa.bundles.p.signing.keyid: 'k' is not in opa.keys",
        ),
        (lambda c: c.update(opa={"allow_unsigned": True}), "opa.allow_unsigned: only used with opa.bundle"),
        (lambda c: c.update(opa={"verification_key": "k"}), "opa.verification_key: only used with opa.bundle"),
        (lambda c: c.update(tls={}), "tls: tls.cert and tls.key are required"),
        (lambda c: c.update(tls={"cert": "c"}), "tls: tls.cert and tls.key are required"),
        (lambda c: c["listen"].update(host="0.0.0.0"), "tls.insecure_http: plain HTTP is only allowed on a loopback"),
        (lambda c: c["tls"].update(cert="c", key="k"), "tls.insecure_http: true, so tls.cert and tls.key are not"),
        (lambda c: c["auth"].update(jwks_url="https://i/j", jwks_file="j"), "auth.jwks_file: give auth.jwks_url or"),
        (lambda c: c["auth"].pop("hs256_secret"), "auth.algorithms: HS256 is accepted but auth.hs256_secret"),
        (lambda c: c["auth"].update(algorithms=["HS256", "RS256"]), "auth.algorithms: RS256 need auth.jwks_url"),
        (lambda c: c["clusters"][0].update(fingerprint="AB" * 32, ca_file="ca.pem"), "clusters.default.ca_file: not"),
        (lambda c: c["clusters"][0].update(fingerprint="AB" * 32, verify_tls=False), "clusters.default.fingerprint"),
    ],
)
def test_contradictions_and_silently_ignored_settings(base: dict[str, Any], change: Any, expected: str) -> None:
    change(base)
    found = problems(base)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_a_mistyped_bundle_setting_is_not_passed_to_opa_to_be_ignored(base: dict[str, Any]) -> None:
    """OPA ignores fields it does not know: `signnig` would have loaded the bundle unsigned."""
    svc = {"s": {"url": "https://s"}}
    keys = {"k": {"key": "PEM", "algorithm": "RS256"}}
    base["opa"] = {"services": svc, "keys": keys, "bundles": {"p": {"service": "s", "signnig": {"keyid": "k"}}}}
    found = problems(base)
    assert found == ["opa.bundles.p.signnig: unknown setting; did you mean opa.bundles.p.signing?"], found
    base["opa"]["bundles"]["p"] = {"service": "s", "signing": {"keyid": "k", "kid": "x"}}
    assert problems(base)[0].startswith("opa.bundles.p.signing.kid: unknown setting"), problems(base)
    base["opa"]["bundles"]["p"] = {"service": "s", "signing": {"keyid": "k"}}
    assert problems(base) == []
    base["opa"]["bundles"]["p"]["signing"]["exclude_files"] = ["*"]  # signed, but not these files
    found = problems(base)
    assert found[0].startswith("opa.bundles.p.signing.exclude_files: files OPA would load without"), found


def test_allow_unsigned_lets_an_unsigned_bundle_load_and_says_so(base: dict[str, Any]) -> None:
    base["opa"] = {"bundle": "b", "allow_unsigned": True}
    assert problems(base) == []
    base["opa"] = {"services": {"s": {"url": "https://s"}}, "bundles": {"p": {"service": "s"}}, "allow_unsigned": True}
    assert problems(base) == []


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("*", "trusted_proxies[1]: '*' would believe the X-Forwarded-For of every client"),
        ("proxy.internal", "trusted_proxies[1]: 'proxy.internal' is not an IP address or CIDR network"),
        ("10.0.0.0/33", "trusted_proxies[1]: '10.0.0.0/33' is not an IP address or CIDR network"),
        ("10.0.0.1/8", "trusted_proxies[1]: '10.0.0.1/8' is not an IP address or CIDR network"),
    ],
)
def test_trusted_proxies_are_addresses_or_networks(base: dict[str, Any], entry: str, expected: str) -> None:
    """uvicorn takes '*' as "trust every peer" (any client then chooses the address the audit and the
    policy see) and keeps any other entry it cannot parse as a literal that never matches: both were
    accepted without a word."""
    base["trusted_proxies"] = ["10.0.0.5", entry]
    found = problems(base)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_trusted_proxies_take_addresses_and_networks(base: dict[str, Any]) -> None:
    base["trusted_proxies"] = ["10.0.0.5", "192.168.0.0/16", "::1", "fd00::/8"]
    assert problems(base) == []


def test_unreadable_or_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration: No such file"):
        load(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("auth: {issuer: [\n")
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load(tmp_path / "broken.yaml")


def test_a_missing_secret_file_names_the_setting(base: dict[str, Any], tmp_path: Path) -> None:
    base["clusters"][0]["token"] = {"file": "secrets/nope"}
    cfg = load(write(tmp_path, base))
    with pytest.raises(ConfigError, match=r"clusters\.default\.token: cannot read secret file .*nope: No such file"):
        cfg.clusters["default"].token.read()


def test_schema_defaults_are_the_defaults_the_gateway_uses(tmp_path: Path) -> None:
    """docs/configuration.md shows the schema's defaults: they must be what parse() applies."""
    raw = minimal(tmp_path)
    raw["clusters"][0]["ssh"] = {"key_file": "k", "nodes": {"n": {"host": "h", "host_key": "ssh-ed25519 AAAA"}}}
    for key in ("listen", "tls", "state_dir", "connectors_dir"):
        raw.pop(key)
    raw["tls"] = {"cert": "c", "key": "k"}
    raw["local_principals"] = {"me": {}}  # one entry with nothing set: its keys' defaults apply
    cfg = parse(raw, tmp_path)
    given = {"tls.cert", "tls.key", "auth.hs256_secret", "clusters[].ssh.nodes", "local_principals"}  # set above
    checked = 0
    for path, node in settings():
        if "default" not in node or path in given:
            continue
        value = _value_at(cfg, path)
        default = node["default"]
        if isinstance(value, Path):
            value = str(value.relative_to(tmp_path))
        if isinstance(value, tuple):
            value = list(value)
        assert value == default, f"{path}: schema default {default!r}, parse() gives {value!r}"
        checked += 1
    assert checked >= 30


_ATTRS = {
    "listen.host": "host",
    "listen.port": "port",
    "admin.token": "admin.token",
    "audit.retention_days": "audit_retention_days",
    "audit.archive_dir": "audit_archive_dir",
    "audit.head_key_file": "audit_head_key_file",
    "audit.min_free_mb": "audit_min_free_mb",
    "audit.auth_failure_rows_per_minute": "audit_auth_failure_rows_per_minute",
}


def _value_at(cfg: Config, path: str) -> Any:
    obj: Any = cfg
    path = _ATTRS.get(path, path)
    for part in path.split("."):
        if part.endswith("[]"):
            obj = next(iter(getattr(obj, part[:-2]).values()))
        elif part == "<name>":
            obj = next(iter(obj.values()))
        else:
            obj = getattr(obj, part)
    return obj


def test_every_key_config_py_reads_is_in_the_schema() -> None:
    """A setting added to config.py without the schema would be refused as unknown: catch it here."""
    tree = ast.parse(Path(config_module.__file__).read_text())
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                read.add(node.args[0].value)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if isinstance(node.slice.value, str):
                read.add(node.slice.value)
    known = {p.rsplit(".", 1)[-1].removesuffix("[]") for p, _ in settings()}
    assert len(read) > 40
    assert read - known == set()


def test_algorithm_enum_is_what_the_authenticator_supports() -> None:
    enum = schema()["properties"]["auth"]["properties"]["algorithms"]["items"]["enum"]
    assert set(enum) == {"HS256", *ALG_KEY_TYPES}


def test_every_object_in_the_schema_refuses_unknown_keys() -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node:
                assert node.get("additionalProperties") is False, where
            for key, sub in node.items():
                walk(sub, f"{where}/{key}")

    walk(schema(), "#")


def test_every_setting_has_a_description() -> None:
    missing = [p for p, node in settings() if not node.get("description")]
    assert missing == []


def _doc_samples() -> list[tuple[str, str]]:
    """YAML blocks in the docs made of configuration settings: whole files or sections."""
    top = set(schema()["properties"])
    out = []
    for md in sorted([*(REPO_ROOT / "docs").rglob("*.md"), REPO_ROOT / "README.md"]):
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", md.read_text(), flags=re.S)):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and doc and set(doc) <= top:
                out.append((f"{md.name}#{i}", block))
    return out


@pytest.mark.parametrize(("name", "block"), _doc_samples())
def test_configuration_samples_in_the_docs_are_valid(name: str, block: str, base: dict[str, Any]) -> None:
    """A section sample is checked inside an otherwise valid file."""
    assert problems({**base, **yaml.safe_load(block)}) == [], name


def test_the_docs_samples_are_found() -> None:
    names = [name for name, _ in _doc_samples()]
    assert any(n.startswith("deployment.md#") for n in names)
    assert any(n.startswith("audit.md#") for n in names)


def test_health_says_whether_the_bundles_signature_is_checked(tmp_path: Path) -> None:
    from gateway.app import bundle_signed
    from tests.config.conftest import minimal, write

    raw = minimal(tmp_path)
    assert bundle_signed(load(write(tmp_path, raw))) is None  # a policy directory on this host
    raw["opa"] = {"bundle": "b.tar.gz", "verification_key": "k.pem"}
    assert bundle_signed(load(write(tmp_path, raw))) is True
    raw["opa"] = {"bundle": "b.tar.gz", "allow_unsigned": True}
    assert bundle_signed(load(write(tmp_path, raw))) is False


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda c: c.update(public_url="https://ops:pw@gw.example"), "public_url"),
        (lambda c: c["auth"].update(jwks_url="https://u:secret@idp.example/jwks"), "auth.jwks_url"),
        (lambda c: c["clusters"][0].update(api_url="https://root:pw@pve.example:8006"), "clusters.default.api_url"),
    ],
)
def test_a_url_setting_with_credentials_is_refused(base: dict[str, Any], change: Any, where: str) -> None:
    """They would be shown wherever the URL is (logs, health, errors); and never in the message itself."""
    change(base)
    found = problems(base)
    assert any(line.startswith(f"{where}: a user name or password in the URL") for line in found), found
    assert not any("pw@" in line or ":secret@" in line for line in found), found


@pytest.mark.parametrize(
    "setting",
    ["clusters.0.token", "auth.hs256_secret", "admin.token", "state_key", "metrics.token", "storage.password"],
)
def test_a_secret_written_inline_is_refused_without_being_shown(base: dict[str, Any], setting: str) -> None:
    """The usual mistake with a secret setting is the secret itself in its place: the refusal (printed by every
    command, logged by serve) names the setting and what belongs there, never the value, once."""
    secret = "root@pam!gw=3f1c2a9e-6b7d-4c1e-TOPSECRET"
    *parents, leaf = setting.split(".")
    node: Any = base
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[leaf] = secret
    if setting == "storage.password":
        base["storage"]["url"] = "postgresql://pvegate@db.example/pvegate"
    found = problems(base)
    assert len(found) == 1, found
    assert "expected {file: PATH} or {env: NAME}, got a string (not shown" in found[0], found
    assert "TOPSECRET" not in found[0] and "3f1c2a9e" not in found[0], found
