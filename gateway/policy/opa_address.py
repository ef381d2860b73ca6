"""Where an OPA listens, and how each HTTP client reaches it.

An address is `http(s)://host:port` (an external OPA) or `unix:///path/opa.sock` (the managed
sidecar: a Unix socket in a directory only the gateway's user may enter, so no other local
user, container or browser can reach its API; see OPASidecar). This module is the one place
that turns an address into a base URL and a transport, for httpx and for aiohttp.

Every client connects to OPA itself: never through a proxy the environment names (HTTP_PROXY and
the like; httpx would use it, aiohttp does not), which would answer for OPA (its revision, its
status, whether its API is open).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx

UNIX_PREFIX = "unix://"
# the Host a request over a socket names: OPA ignores it, HTTP/1.1 needs one
SOCKET_BASE = "http://localhost"


def unix_address(path: str) -> str:
    return f"{UNIX_PREFIX}{path}"


def socket_path(address: str) -> str | None:
    """The socket's path for a `unix://` address, else None."""
    return address[len(UNIX_PREFIX) :] if address.startswith(UNIX_PREFIX) else None


def http_base(address: str) -> str:
    """The base URL requests are written against (paths are appended to it)."""
    return SOCKET_BASE if socket_path(address) is not None else address.rstrip("/")


def direct(address: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """httpx settings that reach the OPA at `address` itself: no proxy from the environment
    (trust_env off), while an https OPA is still verified against the CA files the environment
    names (SSL_CERT_FILE, SSL_CERT_DIR), as with trust_env on."""
    kwargs.setdefault("trust_env", False)
    if address.startswith("https://") and "verify" not in kwargs:
        kwargs["verify"] = httpx.create_ssl_context(trust_env=True)
    return kwargs


def httpx_client(address: str, **kwargs: Any) -> httpx.Client:
    """A synchronous httpx client with `base_url` set to the OPA at `address`."""
    path = socket_path(address)
    if path is not None:
        kwargs["transport"] = httpx.HTTPTransport(uds=path)
    return httpx.Client(base_url=http_base(address), **direct(address, kwargs))


def httpx_async_client(address: str, **kwargs: Any) -> httpx.AsyncClient:
    """An asynchronous httpx client with `base_url` set to the OPA at `address`."""
    path = socket_path(address)
    if path is not None:
        kwargs["transport"] = httpx.AsyncHTTPTransport(uds=path)
    return httpx.AsyncClient(base_url=http_base(address), **direct(address, kwargs))


def aiohttp_connector(address: str) -> aiohttp.BaseConnector | None:
    """The connector for a socket address; None for a TCP one (the client's default)."""
    path = socket_path(address)
    return aiohttp.UnixConnector(path=path) if path is not None else None
