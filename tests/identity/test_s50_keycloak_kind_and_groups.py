"""Two ways a plain Keycloak realm, read with the default claim mapping, gave a principal more than it is.

- An agent was a human. The default tells people by their login session (`sid`), taken to be
  "never in a client-credentials token". Keycloak's client option "Use refresh tokens for client
  credentials grant" gives a service account's client-credentials token a session, so the agent
  became a human: past the policy's "only humans may approve" guard.
- A role was a group. Keycloak's built-in optional client scope `microprofile-jwt`, which any user
  may ask for, writes the user's realm roles into `groups` beside the group paths. Under
  `group_paths: strip_slash` the role `x` is the group `/x`: group bindings and approver groups
  matched memberships the user does not have.
"""

from __future__ import annotations

import httpx
import pytest

from gateway.auth.tokens import Authenticator, AuthError
from gateway.core.config import AuthConfig
from tests.kcserver import AGENT_CLIENT, TESTS_CLIENT, KeycloakServer, User, provision_realm


def authenticator(kc: KeycloakServer) -> Authenticator:
    cfg = AuthConfig(issuer=kc.issuer, audience=kc.audience, jwks_url=kc.jwks_url, algorithms=("RS256",))
    return Authenticator(cfg)


async def test_a_service_account_with_a_session_is_still_an_agent(keycloak: KeycloakServer) -> None:
    kc = keycloak.other_realm("pvegate-s50-sa-session")
    provision_realm(kc)
    with kc.admin() as admin:  # the client option, in this realm only
        cid = kc.client_uuid(admin, AGENT_CLIENT)
        rep = admin.get(f"/clients/{cid}").json()
        rep["attributes"]["client_credentials.use_refresh_token"] = "true"
        admin.put(f"/clients/{cid}", json=rep).raise_for_status()
    agent = await authenticator(kc).authenticate(f"Bearer {kc.client_credentials_token()}")
    assert agent.client_id == AGENT_CLIENT
    assert agent.kind == "agent"  # was "human": its token carries a session (sid)


async def test_roles_asked_into_the_groups_claim_are_refused(keycloak: KeycloakServer) -> None:
    kc = keycloak.other_realm("pvegate-s50-roles-as-groups")
    # carol holds the role sre-leads but is in no group
    provision_realm(kc, users={"carol": User("carol", "carol-password", ("sre-leads",), ())})
    auth = authenticator(kc)

    def token(scope: str) -> str:
        form = {"grant_type": "password", "client_id": TESTS_CLIENT, "username": "carol", "password": "carol-password"}
        r = httpx.post(kc.token_url, data={**form, "scope": scope}, timeout=30)
        assert r.status_code == 200, r.text
        return str(r.json()["access_token"])

    plain = await auth.authenticate(f"Bearer {token('openid')}")
    assert plain.groups == () and "sre-leads" in plain.roles

    with pytest.raises(AuthError, match="microprofile-jwt puts roles in the groups claim"):
        await auth.authenticate(f"Bearer {token('openid microprofile-jwt')}")  # was groups ('sre-leads', …)


def test_only_the_issuing_clients_service_account_is_taken_for_one() -> None:
    """A person whose username merely begins with service-account- (brokered, or chosen where usernames
    are editable) keeps the session rule: only the account of the client the token was issued to
    (Keycloak: service-account-<client id>, in lower case) is an agent through it."""
    from gateway.auth.identity import principal
    from gateway.core.config import AuthConfig

    cfg = AuthConfig(issuer="https://kc.example/realms/x", audience="pvegate-mcp")
    base = {"iss": cfg.issuer, "sub": "s", "sid": "a-session", "azp": "Pvegate-Agent"}
    assert principal({**base, "preferred_username": "service-account-pvegate-agent"}, cfg, ()).kind == "agent"
    assert principal({**base, "preferred_username": "service-account-someone"}, cfg, ()).kind == "human"
    assert principal({**base, "preferred_username": "service-account-pvegate-agent", "azp": None}, cfg, ()).kind == (
        "human"
    )
