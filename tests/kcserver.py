"""The tests' Keycloak: a re-export of gateway/dev/keycloak.py (the demo uses it too, and a demo
cannot import tests/). `python -m tests.kcserver` still starts one by hand."""

from __future__ import annotations

from gateway.dev.keycloak import (
    AGENT_CLIENT,
    CONSOLE_CLIENT,
    CONSOLE_REDIRECT_URIS,
    DEFAULT_AUDIENCE,
    DEFAULT_USERS,
    KEYCLOAK_VERSION,
    REALM,
    SCOPE,
    TESTS_CLIENT,
    KeycloakServer,
    KeycloakUnavailable,
    User,
    install_dir,
    java_home,
    main,
    provision_realm,
    realm_representation,
    start_keycloak,
)

__all__ = [
    "AGENT_CLIENT",
    "CONSOLE_CLIENT",
    "CONSOLE_REDIRECT_URIS",
    "DEFAULT_AUDIENCE",
    "DEFAULT_USERS",
    "KEYCLOAK_VERSION",
    "REALM",
    "SCOPE",
    "TESTS_CLIENT",
    "KeycloakServer",
    "KeycloakUnavailable",
    "User",
    "install_dir",
    "java_home",
    "main",
    "provision_realm",
    "realm_representation",
    "start_keycloak",
]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
