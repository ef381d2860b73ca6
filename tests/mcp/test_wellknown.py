"""Protected resource metadata (RFC 9728) names the resource as the listener serves it, and exists
only when an authorization server issues tokens for it (the document must name at least one)."""

from __future__ import annotations

from pathlib import Path

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
