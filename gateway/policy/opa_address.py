"""Where an OPA listens, and how each HTTP client reaches it.

An address is `http(s)://host:port` (an external OPA) or `unix:///path/opa.sock` (the managed
sidecar: a Unix socket in a directory only the gateway's user may enter, so no other local
user, container or browser can reach its API; see OPASidecar). This module is the one place
that turns an address into a base URL and a transport, for httpx and for aiohttp.
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


def httpx_client(address: str, **kwargs: Any) -> httpx.Client:
    """A synchronous httpx client with `base_url` set to the OPA at `address`."""
    path = socket_path(address)
    if path is not None:
        kwargs["transport"] = httpx.HTTPTransport(uds=path)
    return httpx.Client(base_url=http_base(address), **kwargs)


def httpx_async_client(address: str, **kwargs: Any) -> httpx.AsyncClient:
    """An asynchronous httpx client with `base_url` set to the OPA at `address`."""
    path = socket_path(address)
    if path is not None:
        kwargs["transport"] = httpx.AsyncHTTPTransport(uds=path)
    return httpx.AsyncClient(base_url=http_base(address), **kwargs)


def aiohttp_connector(address: str) -> aiohttp.BaseConnector | None:
    """The connector for a socket address; None for a TCP one (the client's default)."""
    path = socket_path(address)
    return aiohttp.UnixConnector(path=path) if path is not None else None
