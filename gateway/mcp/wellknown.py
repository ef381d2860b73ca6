"""OAuth 2.0 Protected Resource Metadata (RFC 9728) for the MCP endpoint.

MCP clients that get a 401 follow `resource_metadata` from WWW-Authenticate to
this document to learn which authorization server issues tokens for us.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.core.config import Config

WELL_KNOWN = "/.well-known/oauth-protected-resource"
MCP_PATH = "/mcp"


def base_url(config: Config) -> str:
    scheme = "http" if config.tls.insecure_http else "https"  # what the listener speaks
    return (config.public_url or f"{scheme}://{config.host}:{config.port}").rstrip("/")


def resource_url(config: Config) -> str:
    """The canonical resource identifier (RFC 8707) agents should request tokens for."""
    return base_url(config) + MCP_PATH


def token_resource(config: Config) -> str | None:
    """The resource URL a token may carry as its audience beside auth.audience (RFC 8707), or None: only a
    configured public_url names this gateway alone. A listener address (https://0.0.0.0:8443/mcp) is the
    same on every gateway with that listener, so a token asked for at another gateway would pass here."""
    return resource_url(config) if config.public_url else None


def metadata_url(config: Config) -> str:
    """Path-suffixed form (RFC 9728 §3.1): the metadata of exactly the /mcp resource."""
    return base_url(config) + WELL_KNOWN + MCP_PATH


def authorization_servers(config: Config) -> list[str]:
    """auth.authorization_servers, else the issuer when it is a URL (an AS's metadata is found
    from its issuer URL, RFC 8414 / OpenID Connect Discovery)."""
    if config.auth.authorization_servers is not None:
        return list(config.auth.authorization_servers)
    return [config.auth.issuer] if "://" in config.auth.issuer else []


def metadata(config: Config) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "resource": resource_url(config),
        "authorization_servers": authorization_servers(config),
        "bearer_methods_supported": ["header"],
        "resource_name": "pvegate Proxmox VE gateway",
    }
    if config.auth.required_scopes:
        doc["scopes_supported"] = list(config.auth.required_scopes)
    return doc


async def protected_resource(request: Request) -> Response:
    """The metadata, when an authorization server issues tokens for us: RFC 9728 / MCP require at
    least one in it. Without one (static tokens: an issuer that is no URL, as in the demo), there is
    no document and 401 challenges do not point at one (transport.www_authenticate)."""
    config: Config = request.app.state.components.config
    if not authorization_servers(config):
        return JSONResponse({"error": "not_found", "detail": "no authorization server issues tokens here"}, 404)
    return JSONResponse(metadata(config), headers={"cache-control": "public, max-age=300"})
