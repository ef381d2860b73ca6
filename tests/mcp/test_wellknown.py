"""Protected resource metadata (RFC 9728) names the resource as the listener serves it, and exists
only when an authorization server issues tokens for it (the document must name at least one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.core.config import load
from gateway.mcp import wellknown
from tests.config.conftest import minimal, write


def test_the_resource_is_named_with_the_scheme_the_listener_speaks(tmp_path: Path) -> None:
    raw = minimal(tmp_path)
    raw["tls"] = {"insecure_http": True}
    cfg = load(write(tmp_path, raw))
    assert wellknown.resource_url(cfg) == f"http://{cfg.host}:{cfg.port}/mcp"
    assert wellknown.metadata_url(cfg).startswith(f"http://{cfg.host}:{cfg.port}/.well-known/")
    raw["public_url"] = "https://pvegate.example.org"  # behind a TLS proxy: what the clients use
    cfg = load(write(tmp_path, raw))
    assert wellknown.resource_url(cfg) == "https://pvegate.example.org/mcp"


def test_authorization_servers_come_from_the_config_or_an_issuer_url(tmp_path: Path) -> None:
    raw = minimal(tmp_path)
    raw["tls"] = {"insecure_http": True}
    cfg = load(write(tmp_path, raw))
    assert wellknown.authorization_servers(cfg) == []  # static tokens: no document (404) and no pointer
    raw["auth"]["issuer"] = "https://idp.example.org/realms/ops"
    cfg = load(write(tmp_path, raw))
    assert wellknown.metadata(cfg)["authorization_servers"] == ["https://idp.example.org/realms/ops"]


def test_only_a_public_url_names_a_resource_tokens_may_carry_as_audience(tmp_path: Path) -> None:
    """Without public_url the resource is the listener's address, the same on every gateway listening
    there (https://127.0.0.1:8443/mcp): a token asked for at another gateway would pass this one's audience
    check (found by a review). Only a configured public_url is accepted as an audience beside auth.audience."""
    import asyncio

    import jwt

    from gateway.auth.tokens import Authenticator, AuthError

    raw = minimal(tmp_path)
    raw["listen"] = {"host": "127.0.0.1", "port": 8443}
    cfg = load(write(tmp_path, raw))
    assert wellknown.token_resource(cfg) is None
    secret = cfg.auth.hs256_secret.read() if cfg.auth.hs256_secret else None
    assert secret is not None

    def token(aud: str) -> str:
        claims = {"iss": cfg.auth.issuer, "aud": aud, "sub": "agent-1", "exp": 4102444800, "iat": 1700000000}
        return jwt.encode(claims, secret, algorithm="HS256")

    other_gateway = wellknown.resource_url(cfg)  # what a same-listener gateway advertises too
    auth = Authenticator(cfg.auth, resource=wellknown.token_resource(cfg))
    with pytest.raises(AuthError, match="audience"):
        asyncio.run(auth.authenticate(f"Bearer {token(other_gateway)}"))
    raw["public_url"] = "https://pvegate.example.org"
    cfg = load(write(tmp_path, raw))
    assert wellknown.token_resource(cfg) == "https://pvegate.example.org/mcp"
    auth = Authenticator(cfg.auth, resource=wellknown.token_resource(cfg))
    assert asyncio.run(auth.authenticate(f"Bearer {token('https://pvegate.example.org/mcp')}")).sub == "agent-1"
