"""From a verified token's claims to the Principal policies see: the mapping is configuration
(auth.roles_claim, groups_claim, group_paths, subject_claim, client_id_claims, kind), so tokens of
real identity providers (Keycloak, Entra ID) fit without custom claims. Recipes: docs/identity.md.

Whether a principal may do something (approve, call a tool) is never decided here: that is Rego's.
"""

from __future__ import annotations

from typing import Any

from gateway.core.config import AuthConfig, KindConfig
from gateway.core.principal import Principal


class ClaimError(ValueError):
    """A claim the mapping reads has a shape or value it cannot use (the token is refused)."""


def claim(claims: dict[str, Any], path: str) -> Any:
    """The value at a dot path (`realm_access.roles`), or None when any step is missing."""
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def strings(value: Any, what: str, *, split: bool = False) -> tuple[str, ...]:
    """A list of strings, or one string; absent is empty.

    `split`: a string is a space-separated list (OAuth `scope`, RFC 6749 §3.3). Only scopes are:
    a single role or group named in a string is one value, spaces included (`/Domain Users`)."""
    if value is None:
        return ()
    if isinstance(value, str):
        if split:
            return tuple(v for v in value.split() if v)
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ClaimError(f"token claim {what} has an unexpected type")


def _paths(setting: str | tuple[str, ...]) -> tuple[str, ...]:
    return (setting,) if isinstance(setting, str) else setting


def _joined(claims: dict[str, Any], setting: str | tuple[str, ...]) -> tuple[str, ...]:
    """The values of several claim paths, in order, without duplicates."""
    out: dict[str, None] = {}
    for path in _paths(setting):
        for v in strings(claim(claims, path), path):
            out[v] = None
    return tuple(out)


def normalise_group(name: str, mode: str) -> str:
    if mode == "full":
        return name
    stripped = name.lstrip("/")
    if mode == "leaf":
        return stripped.rsplit("/", 1)[-1]
    return stripped  # strip_slash


# Keycloak's built-in optional client scope: its mapper writes the user's realm roles into the
# claim `groups`, merged with the group mapper's paths. Any user may ask for an optional scope, so
# a role (`/x` and `x` are one group under strip_slash) would pass for a group membership.
KEYCLOAK_ROLES_AS_GROUPS_SCOPE = "microprofile-jwt"


def groups(claims: dict[str, Any], cfg: AuthConfig, scopes: tuple[str, ...] = ()) -> tuple[str, ...]:
    if KEYCLOAK_ROLES_AS_GROUPS_SCOPE in scopes and "groups" in _paths(cfg.groups_claim):
        raise ClaimError(
            f"token scope {KEYCLOAK_ROLES_AS_GROUPS_SCOPE} puts roles in the groups claim: "
            "ask for the token without it (docs/identity.md)"
        )
    out: dict[str, None] = {}
    for g in _joined(claims, cfg.groups_claim):
        if name := normalise_group(g, cfg.group_paths):
            out[name] = None
    return tuple(out)


def client_id(claims: dict[str, Any], cfg: AuthConfig) -> str | None:
    for path in cfg.client_id_claims:
        value = claim(claims, path)
        if isinstance(value, str) and value:
            return value
    return None


# the username Keycloak gives a client's service-account user (ServiceAccountConstants)
KEYCLOAK_SERVICE_ACCOUNT_PREFIX = "service-account-"


def _service_account(claims: dict[str, Any]) -> bool:
    """The token is the service account's of the client it was issued to: a person whose username
    merely begins so (brokered, or chosen where usernames are editable) is not one (Keycloak keeps
    usernames in lower case)."""
    username, azp = claims.get("preferred_username"), claims.get("azp")
    if not isinstance(username, str) or not isinstance(azp, str) or not azp:
        return False
    return username.lower() == f"{KEYCLOAK_SERVICE_ACCOUNT_PREFIX}{azp}".lower()


def kind(claims: dict[str, Any], client: str | None, rules: KindConfig) -> str:
    """agent_clients, then the kind claim, then human_clients, then human_when_claims, then the default.

    Agent clients come first: an operator who lists a client there means that nothing its
    credentials obtain may count as a human (who may approve)."""
    if client is not None and client in rules.agent_clients:
        return "agent"
    if rules.claim is not None:
        value = claim(claims, rules.claim)
        if value is not None:
            if not isinstance(value, str) or value not in rules.values:
                raise ClaimError(f"token claim {rules.claim} has a value that names no principal kind")
            return rules.values[value]
    if client is not None and client in rules.human_clients:
        return "human"
    # a session is no person's when a Keycloak service account holds it: the client option "Use
    # refresh tokens for client credentials grant" gives client-credentials tokens a `sid`
    if not _service_account(claims) and any(claim(claims, path) not in (None, "") for path in rules.human_when_claims):
        return "human"
    return rules.default


def principal(claims: dict[str, Any], cfg: AuthConfig, scopes: tuple[str, ...]) -> Principal:
    sub = claim(claims, cfg.subject_claim)
    if not isinstance(sub, str) or not sub:
        raise ClaimError(f"token lacks the subject claim {cfg.subject_claim!r}")
    client = client_id(claims, cfg)
    return Principal(
        sub=sub,
        iss=str(claims["iss"]),
        roles=_joined(claims, cfg.roles_claim),
        groups=groups(claims, cfg, scopes),
        scopes=scopes,
        client_id=client,
        kind=kind(claims, client, cfg.kind),
    )
