"""The claims-to-principal mapping (auth.roles_claim, groups_claim, group_paths, subject_claim,
client_id_claims, kind): the shapes real providers send, and mistyped settings refused.
The same mapping against a live Keycloak is tests/identity/."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gateway.auth.identity import ClaimError, principal
from gateway.core.config import AuthConfig, KindConfig, parse
from gateway.core.config_schema import problems
from tests.config.conftest import minimal

ISS = "https://kc.example/realms/pvegate"

# what a plain Keycloak realm puts in tokens (the group-membership mapper with full paths on)
KC_AGENT = {
    "iss": ISS,
    "sub": "d39c6542-246f-4cfd-abc3-4867ce53e730",
    "azp": "pvegate-agent",
    "realm_access": {"roles": ["offline_access", "default-roles-pvegate", "operator"]},
    "preferred_username": "service-account-pvegate-agent",
    "scope": "email profile",
}
KC_HUMAN = {
    "iss": ISS,
    "sub": "6831fc17-ccf8-48ed-bd05-3025ff9c3939",
    "azp": "pvegate-console",
    "sid": "EcdgBcbuzoBT6Uo1-v1qz_vi",
    "realm_access": {"roles": ["approver", "default-roles-pvegate"]},
    "groups": ["/sre-leads", "/org/platform/ops"],
    "preferred_username": "alice",
}
# Entra ID v2 access tokens: app roles in `roles`, groups as object ids, `idtyp` (optional claim)
ENTRA_APP = {"iss": ISS, "sub": "app-oid", "azp": "11111111-agent", "roles": ["operator"], "idtyp": "app"}
ENTRA_USER = {"iss": ISS, "sub": "user-oid", "azp": "22222222-console", "roles": ["approver"], "idtyp": "user"}


def cfg(**kw: Any) -> AuthConfig:
    return AuthConfig(issuer=ISS, audience="pvegate-mcp", **kw)


def test_the_default_fits_a_plain_keycloak_realm() -> None:
    agent = principal(KC_AGENT, cfg(), ())
    assert agent.kind == "agent" and agent.client_id == "pvegate-agent" and "operator" in agent.roles
    assert agent.groups == ()
    human = principal(KC_HUMAN, cfg(), ())
    assert human.kind == "human"  # the login session (sid) says so, no custom claim
    assert human.groups == ("sre-leads", "org/platform/ops")  # leading slash stripped
    assert "approver" in human.roles and human.client_id == "pvegate-console"
    assert human.sub == KC_HUMAN["sub"]


def test_group_path_modes() -> None:
    assert principal(KC_HUMAN, cfg(group_paths="full"), ()).groups == ("/sre-leads", "/org/platform/ops")
    assert principal(KC_HUMAN, cfg(group_paths="leaf"), ()).groups == ("sre-leads", "ops")


def test_several_role_and_group_claims_are_joined_without_duplicates() -> None:
    claims = {**KC_HUMAN, "roles": ["approver", "auditor"], "teams": ["sre-leads", "web"]}
    p = principal(claims, cfg(roles_claim=("roles", "realm_access.roles"), groups_claim=("groups", "teams")), ())
    assert p.roles == ("approver", "auditor", "default-roles-pvegate")
    assert p.groups == ("sre-leads", "org/platform/ops", "web")


def test_subject_and_client_id_claims() -> None:
    p = principal(KC_HUMAN, cfg(subject_claim="preferred_username"), ())
    assert p.sub == "alice"
    assert principal({**KC_AGENT, "azp": None, "client_id": "cid"}, cfg(), ()).client_id == "cid"
    assert principal(KC_AGENT, cfg(client_id_claims=("client_id",)), ()).client_id is None
    with pytest.raises(ClaimError, match="subject claim 'upn'"):
        principal(KC_AGENT, cfg(subject_claim="upn"), ())


def test_kind_rules_in_order() -> None:
    # an agent client is an agent even with a login session: nothing its credentials obtain approves
    rules = KindConfig(agent_clients=("pvegate-console",))
    assert principal(KC_HUMAN, cfg(kind=rules), ()).kind == "agent"
    # the explicit claim, mapped by values (Entra ID's idtyp)
    entra = KindConfig(claim="idtyp", values={"app": "agent", "user": "human"}, human_when_claims=())
    assert principal(ENTRA_APP, cfg(kind=entra), ()).kind == "agent"
    assert principal(ENTRA_USER, cfg(kind=entra), ()).kind == "human"
    # a client listed as human's, without a session claim
    no_sid = {k: v for k, v in KC_HUMAN.items() if k != "sid"}
    assert principal(no_sid, cfg(), ()).kind == "agent"
    assert principal(no_sid, cfg(kind=KindConfig(human_clients=("pvegate-console",))), ()).kind == "human"
    # pvegate's own minted tokens keep working
    assert principal({**KC_AGENT, "pvegate_kind": "human"}, cfg(), ()).kind == "human"
    assert principal({**KC_AGENT, "pvegate_kind": "service"}, cfg(), ()).kind == "service"
    assert principal(KC_AGENT, cfg(kind=KindConfig(default="service")), ()).kind == "service"


@pytest.mark.parametrize("value", ["admin", "", 7, ["human"]])
def test_an_unmapped_kind_value_refuses_the_token(value: object) -> None:
    with pytest.raises(ClaimError, match="names no principal kind"):
        principal({**KC_HUMAN, "pvegate_kind": value}, cfg(), ())


def test_a_claim_of_the_wrong_shape_refuses_the_token() -> None:
    with pytest.raises(ClaimError, match="groups has an unexpected type"):
        principal({**KC_HUMAN, "groups": [1, 2]}, cfg(), ())


def test_configuration_parses_the_mapping(tmp_path: Path) -> None:
    raw = minimal(tmp_path)
    raw["auth"].update(
        {
            "roles_claim": "realm_access.roles",
            "groups_claim": ["groups", "teams"],
            "group_paths": "leaf",
            "subject_claim": "preferred_username",
            "client_id_claims": ["appid"],
            "kind": {"claim": "idtyp", "values": {"app": "agent"}, "agent_clients": ["a"], "human_when_claims": []},
            "authorization_servers": ["https://login.example/tenant/v2.0"],
        }
    )
    auth = parse(raw, tmp_path).auth
    assert auth.roles_claim == ("realm_access.roles",) and auth.groups_claim == ("groups", "teams")
    assert auth.group_paths == "leaf" and auth.subject_claim == "preferred_username"
    assert auth.kind == KindConfig(agent_clients=("a",), claim="idtyp", values={"app": "agent"}, human_when_claims=())
    assert auth.authorization_servers == ("https://login.example/tenant/v2.0",)


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("group_paths", "strip", "auth.group_paths"),
        ("roles_claim", [], "auth.roles_claim"),
        ("roles_claim", "", "auth.roles_claim"),
        ("kind", {"defualt": "agent"}, "auth.kind.defualt: unknown setting"),
        ("kind", {"default": "robot"}, "auth.kind.default"),
        ("kind", {"values": {"app": "robot"}}, "auth.kind.values"),
        ("kind", {"human_when_claims": "sid"}, "auth.kind.human_when_claims"),
        ("authorization_servers", ["login.example"], "auth.authorization_servers"),
        ("client_id_claims", "azp", "auth.client_id_claims"),
    ],
)
def test_mistyped_mapping_settings_are_refused(tmp_path: Path, setting: str, value: object, expected: str) -> None:
    raw = copy.deepcopy(minimal(tmp_path))
    raw["auth"][setting] = value
    found = problems(raw)
    assert any(p.startswith(expected) for p in found), found


def test_the_recipes_in_docs_identity_are_valid_configuration(tmp_path: Path) -> None:
    """Each ```yaml auth section of docs/identity.md (Keycloak, Entra ID) passes the schema."""
    import re

    import yaml

    from gateway.policy.opa_sidecar import REPO_ROOT

    blocks = re.findall(r"```yaml\n(.*?)```", (REPO_ROOT / "docs" / "identity.md").read_text(), re.S)
    assert len(blocks) == 2
    for block in blocks:
        raw = copy.deepcopy(minimal(tmp_path))
        raw["auth"] = yaml.safe_load(block)["auth"]
        assert problems(raw) == [], block
        parse(raw, tmp_path)
