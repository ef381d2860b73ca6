"""The real OpenID Connect provider the identity tests use (tests/kcserver.py): it starts, its realm
is provisioned, and its tokens verify against its live JWKS with pvegate's own authenticator."""

from __future__ import annotations

import asyncio

import httpx
import jwt

from gateway.auth.jwks import JwksKeys
from gateway.auth.tokens import Authenticator
from gateway.core.config import AuthConfig
from tests.kcserver import AGENT_CLIENT, KEYCLOAK_VERSION, KeycloakServer


def _authenticator(kc: KeycloakServer) -> Authenticator:
    cfg = AuthConfig(
        issuer=kc.issuer,
        audience=kc.audience,
        jwks_url=kc.jwks_url,
        algorithms=("RS256",),
        roles_claim="realm_access.roles",
    )
    return Authenticator(cfg, JwksKeys(url=kc.jwks_url))


def test_provider_serves_its_discovery_document_on_loopback(keycloak: KeycloakServer) -> None:
    doc = httpx.get(keycloak.discovery_url, timeout=10).json()
    assert doc["issuer"] == keycloak.issuer
    assert doc["jwks_uri"] == keycloak.jwks_url
    assert "S256" in doc["code_challenge_methods_supported"]
    assert keycloak.base_url.startswith("http://127.0.0.1:")
    # what the suite runs is the pinned version
    admin = {"authorization": f"Bearer {keycloak.admin_token()}"}
    info = httpx.get(f"{keycloak.base_url}/admin/serverinfo", headers=admin)
    assert info.json()["systemInfo"]["version"] == KEYCLOAK_VERSION


def test_agent_and_human_tokens_verify_against_the_live_jwks(keycloak: KeycloakServer) -> None:
    auth = _authenticator(keycloak)
    agent_token = keycloak.client_credentials_token()
    agent_claims = jwt.decode(agent_token, options={"verify_signature": False})
    assert agent_claims["azp"] == AGENT_CLIENT and "sid" not in agent_claims
    agent = asyncio.run(auth.authenticate(f"Bearer {agent_token}"))
    assert agent.iss == keycloak.issuer and "operator" in agent.roles

    human_token = keycloak.password_token("alice")
    human_claims = jwt.decode(human_token, options={"verify_signature": False})
    assert human_claims["preferred_username"] == "alice" and human_claims["sid"]
    assert human_claims["groups"] == ["/sre-leads"]  # Keycloak's group mapper: full paths
    human = asyncio.run(auth.authenticate(f"Bearer {human_token}"))
    assert "approver" in human.roles and human.sub == human_claims["sub"]


def test_wrong_password_and_wrong_secret_get_no_token(keycloak: KeycloakServer) -> None:
    r = httpx.post(
        keycloak.token_url,
        data={"grant_type": "client_credentials", "client_id": AGENT_CLIENT, "client_secret": "not-the-secret"},
    )
    assert r.status_code == 401 and r.json()["error"] == "unauthorized_client"
    r = httpx.post(
        keycloak.token_url,
        data={"grant_type": "password", "client_id": "pvegate-tests", "username": "alice", "password": "nope"},
    )
    assert r.status_code == 401 and r.json()["error"] == "invalid_grant"
