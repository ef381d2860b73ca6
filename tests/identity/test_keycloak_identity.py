"""Identity with a real OpenID Connect provider (Keycloak, tests/kcserver.py) and the default claim
mapping: kinds, roles and groups of real tokens; an approver from the provider approves with no
custom claim; key rotation at the provider is followed; and an MCP client that only does OAuth
finds the provider through pvegate's protected-resource metadata, gets a token and calls a tool."""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from typing import Any

import httpx
import httpx2
import jwt
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig, KindConfig
from gateway.dev.devenv import DevEnv
from tests.approvals.conftest import Api, outcome
from tests.kcserver import AGENT_CLIENT, SCOPE, TESTS_CLIENT, KeycloakServer, provision_realm
from tests.support import GatewayThread, audit_rows

_timeouts = itertools.count(31)


def default_authenticator(kc: KeycloakServer, **kw: Any) -> Authenticator:
    """The gateway's authenticator with nothing configured but the provider: the default mapping."""
    cfg = AuthConfig(issuer=kc.issuer, audience=kc.audience, jwks_url=kc.jwks_url, algorithms=("RS256",), **kw)
    return Authenticator(cfg)


def unverified(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


async def test_agent_and_human_tokens_map_to_kinds_roles_and_groups(keycloak: KeycloakServer) -> None:
    auth = default_authenticator(keycloak)
    agent = await auth.authenticate(f"Bearer {keycloak.client_credentials_token()}")
    assert agent.kind == "agent" and agent.client_id == AGENT_CLIENT
    assert "operator" in agent.roles and agent.groups == ()

    alice_token = keycloak.password_token("alice")
    alice = await auth.authenticate(f"Bearer {alice_token}")
    assert alice.kind == "human"  # her login session (sid), no pvegate_kind claim
    assert "pvegate_kind" not in unverified(alice_token)
    assert "approver" in alice.roles and alice.groups == ("sre-leads",)  # '/sre-leads' normalised
    assert alice.client_id == TESTS_CLIENT and alice.sub == unverified(alice_token)["sub"]

    bob = await auth.authenticate(f"Bearer {keycloak.password_token('bob')}")
    assert bob.kind == "human" and "viewer" in bob.roles and bob.groups == ()

    # the operator's statement wins: tokens of an agent client are agents even with a session
    strict = default_authenticator(keycloak, kind=KindConfig(agent_clients=(TESTS_CLIENT,)))
    assert (await strict.authenticate(f"Bearer {alice_token}")).kind == "agent"


def shutdown_args() -> dict[str, Any]:
    return {"vmid": 100, "timeout": next(_timeouts)}  # a distinct call each time


async def test_an_approver_from_the_provider_approves_without_a_custom_claim(
    iapi: Api, keycloak: KeycloakServer, isim: Any
) -> None:
    agent_token = keycloak.client_credentials_token()
    args = shutdown_args()
    held = await iapi.call(agent_token, "vm_shutdown", args)
    assert outcome(held) == "pending_approval", held
    aid = str(held["structuredContent"]["approval"]["id"])
    assert held["structuredContent"]["approval"]["approver_groups"] == ["sre-leads"]

    # the agent itself (client credentials: no session) is not a human
    own = await iapi.vote(aid, agent_token)
    assert own.status_code == 403 and any("only humans may approve" in r for r in own.json()["reasons"]), own.text
    # bob is a human with no approver group
    bob = await iapi.vote(aid, keycloak.password_token("bob"))
    assert bob.status_code == 403, bob.text
    assert any("not in any of the approver groups" in r for r in bob.json()["reasons"])
    # alice: realm group /sre-leads from Keycloak's own group mapper, kind from her session
    alice_token = keycloak.password_token("alice")
    alice = await iapi.vote(aid, alice_token)
    assert alice.status_code == 200 and alice.json()["state"] == "approved", alice.text

    done = await iapi.call(agent_token, "vm_shutdown", args, approval=alice.json()["token"])
    assert outcome(done) in ("allowed", "failed"), done  # it ran (a failure is Proxmox's answer)
    shutdowns = [
        r
        for r in isim.requests_log()
        if r["path"].endswith("/status/shutdown") and str((r.get("body") or {}).get("timeout")) == str(args["timeout"])
    ]
    assert len(shutdowns) == 1
    # the audit names the approver by the provider's subject
    approved = [r for r in audit_rows(iapi.env.config.audit_path, aid) if r["outcome"] == "approved"]
    assert [r["principal"] for r in approved] == [unverified(alice_token)["sub"]]


async def test_key_rotation_at_the_provider_is_followed(keycloak: KeycloakServer) -> None:
    # its own realm: rotating the session realm's keys would disturb other tests' gateways
    kc = keycloak.other_realm("pvegate-rotation")
    provision_realm(kc)
    auth = default_authenticator(kc, jwks_cache_seconds=2)

    old_token = kc.client_credentials_token()
    await auth.authenticate(f"Bearer {old_token}")
    old_key = kc.signing_keys()[0]
    new_key = kc.add_signing_key("rotated", priority=int(old_key["config"]["priority"][0]) + 100)
    new_token = kc.client_credentials_token()
    old_kid, new_kid = jwt.get_unverified_header(old_token)["kid"], jwt.get_unverified_header(new_token)["kid"]
    assert old_kid != new_kid  # the provider signs with the new key now

    # an unknown kid makes the gateway fetch the JWKS again (at most once per 10 s): followed promptly
    deadline = time.monotonic() + 25
    while True:
        try:
            assert (await auth.authenticate(f"Bearer {new_token}")).client_id == AGENT_CLIENT
            break
        except AuthError as exc:
            assert "unknown signing key" in str(exc)
            assert time.monotonic() < deadline, "the rotated key was not followed within 25 s"
            await asyncio.sleep(1)
    await auth.authenticate(f"Bearer {old_token}")  # still published: still valid

    kc.remove_signing_key(old_key["id"])
    published = httpx.get(kc.jwks_url).json()["keys"]
    assert old_kid not in {k["kid"] for k in published} and new_kid in {k["kid"] for k in published}
    deadline = time.monotonic() + 30
    while True:  # refused once the cached key set is older than jwks_cache_seconds (and 10 s since the last fetch)
        try:
            await auth.authenticate(f"Bearer {old_token}")
        except AuthError as exc:
            assert "unknown signing key" in str(exc)
            break
        assert time.monotonic() < deadline, "a key removed at the provider was still trusted after 30 s"
        await asyncio.sleep(1)
    await auth.authenticate(f"Bearer {new_token}")
    assert new_key in {k["id"] for k in kc.signing_keys()}


class MemoryTokens:
    """The SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


async def test_an_mcp_client_discovers_the_provider_and_calls_a_tool(
    igw: GatewayThread, ienv: DevEnv, keycloak: KeycloakServer
) -> None:
    ctx = ssl.create_default_context(cafile=str(ienv.ca_file))
    base = ienv.url.rsplit("/mcp", 1)[0]
    # what the client will follow: the 401's challenge, then the resource's metadata
    async with httpx.AsyncClient(verify=ctx) as http:
        bare = await http.post(ienv.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert bare.status_code == 401
        challenge = bare.headers["www-authenticate"]
        assert "error" not in challenge  # no credentials: no error code (RFC 6750 §3.1)
        assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in challenge
        prm = (await http.get(f"{base}/.well-known/oauth-protected-resource/mcp")).json()
    assert prm["resource"] == ienv.url and prm["authorization_servers"] == [keycloak.issuer]
    assert prm["scopes_supported"] == [SCOPE]  # what the client asks the provider for

    # the MCP Python SDK's own OAuth client: discovery (RFC 9728, then the provider's metadata),
    # client credentials at the discovered token endpoint, the token on every request
    storage = MemoryTokens()
    oauth = ClientCredentialsOAuthProvider(
        server_url=ienv.url,
        storage=storage,
        client_id=AGENT_CLIENT,
        client_secret=keycloak.agent_secret,
        issuer=keycloak.issuer,
    )
    async with (
        httpx2.AsyncClient(auth=oauth, verify=ctx, timeout=30) as http2,
        streamable_http_client(ienv.url, http_client=http2) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = {t.name for t in (await session.list_tools()).tools}
        assert "list_nodes" in listed
        res = await session.call_tool("list_nodes", {})
        assert not res.is_error, res
        assert {r["node"] for r in (res.structured_content or {})["items"]} == {"pve1", "pve2", "pve3"}
    assert storage.tokens is not None
    claims = unverified(storage.tokens.access_token)
    assert claims["iss"] == keycloak.issuer and claims["azp"] == AGENT_CLIENT
    assert SCOPE in claims["scope"].split()


async def test_the_console_matches_its_id_token_by_the_configured_subject(keycloak: KeycloakServer) -> None:
    """auth.subject_claim applies to the console's sign-in too: the ID token's subject is read
    with the same claim as the access token's principal (here Keycloak's preferred_username)."""
    from types import SimpleNamespace

    from gateway.admin.console.views import _principal

    form = {"grant_type": "password", "client_id": TESTS_CLIENT, "username": "alice", "scope": "openid"}
    doc = httpx.post(keycloak.token_url, data={**form, "password": keycloak.users["alice"].password}).json()
    id_claims = unverified(doc["id_token"])
    console = SimpleNamespace(authn=default_authenticator(keycloak, subject_claim="preferred_username"))
    who = await _principal(console, id_claims, doc["access_token"])  # type: ignore[arg-type]
    assert who.sub == "alice" and who.kind == "human"
