"""The origin of public_url, as the transport guard (every route) and the console's same-origin check
(its POSTs) read it: one reading, so a browser's request the console accepts is not refused in front of
it. Found in review: with `public_url: https://gw.example.org:443` the guard allowed only the Origin
`https://gw.example.org:443`, which no browser sends (it leaves the default port out), so every console
POST was refused with 403 before the console's own check (which fills the default port in) could pass it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from gateway.admin.console.session import same_origin
from gateway.core.origins import as_host, host_values, origin_values, url_origin
from gateway.mcp.security import TransportGuard, allowed_hosts, allowed_origins


def config(public_url: str | None, host: str = "0.0.0.0", port: int = 8443) -> Any:
    return SimpleNamespace(
        allowed_hosts=[],
        allowed_origins=[],
        public_url=public_url,
        host=host,
        port=port,
        max_body_bytes=1 << 20,
        max_inflight_per_client=8,
    )


async def guard_status(public_url: str, origin: str) -> int:
    """The status the transport guard answers a request to public_url's host with (200: handed on)."""
    host = urlsplit(public_url).netloc

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/admin/approvals/x/vote",
        "headers": [(b"host", host.encode()), (b"origin", origin.encode())],
        "client": ("192.0.2.7", 5555),
    }
    await TransportGuard(app, config(public_url))(scope, receive, send)
    return int(sent[0]["status"])


def console_accepts(public_url: str, origin: str) -> bool:
    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"origin", origin.encode())]}
    return same_origin(Request(scope), public_url)


# (public_url, Origin a client sends): the same origin, written either way
SAME = [
    ("https://gw.example.org:443", "https://gw.example.org"),  # what a browser sends: no default port
    ("https://gw.example.org:443/", "https://gw.example.org"),
    ("https://gw.example.org", "https://gw.example.org:443"),
    ("https://gw.example.org", "https://gw.example.org"),
    ("http://gw.example.org:80", "http://gw.example.org"),
    ("https://GW.Example.org:8443/base/", "https://gw.example.org:8443"),
    ("https://[2001:db8::7]:9443", "https://[2001:db8::7]:9443"),
    ("https://[2001:DB8::7]:443", "https://[2001:db8::7]"),
]
# another origin: another scheme, host or port
OTHER = [
    ("https://gw.example.org:443", "http://gw.example.org"),
    ("https://gw.example.org", "https://gw.example.org:8443"),
    ("https://gw.example.org:8443", "https://gw.example.org"),
    ("https://gw.example.org", "https://evil.example"),
    ("https://[2001:db8::7]:9443", "https://[2001:db8::8]:9443"),
]


@pytest.mark.parametrize(("public_url", "origin"), SAME)
async def test_the_guard_and_the_console_both_accept_the_same_origin(public_url: str, origin: str) -> None:
    assert console_accepts(public_url, origin)
    assert await guard_status(public_url, origin) == 200


@pytest.mark.parametrize(("public_url", "origin"), OTHER)
async def test_the_guard_and_the_console_both_refuse_another_origin(public_url: str, origin: str) -> None:
    assert not console_accepts(public_url, origin)
    assert await guard_status(public_url, origin) == 403


def test_the_public_urls_origin_is_allowed_as_a_browser_writes_it() -> None:
    assert "https://gw.example.org" in allowed_origins(config("https://gw.example.org:443/"))
    assert "https://[2001:db8::7]:9443" in allowed_origins(config("https://[2001:DB8::7]:9443"))


@pytest.mark.parametrize(
    ("public_url", "hosts"),
    [
        ("https://gw.example.org:8443/base", {"gw.example.org:8443", "gw.example.org"}),
        ("https://gw.example.org:443", {"gw.example.org:443", "gw.example.org"}),
        ("https://gw.example.org", {"gw.example.org:443", "gw.example.org"}),  # the default port written or not
        ("https://[2001:db8::7]:9443", {"[2001:db8::7]:9443", "[2001:db8::7]"}),
    ],
)
def test_the_public_urls_host_is_allowed_with_its_port_and_without(public_url: str, hosts: set[str]) -> None:
    found = allowed_hosts(config(public_url))
    assert found is not None and hosts <= found


# -- the shared reading itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://gw.example.org", ("https", "gw.example.org", 443)),
        ("HTTPS://GW.Example.ORG:443/base/?x", ("https", "gw.example.org", 443)),
        ("http://gw.example.org", ("http", "gw.example.org", 80)),
        ("http://gw.example.org:8080", ("http", "gw.example.org", 8080)),
        ("https://[2001:DB8::7]:9443/", ("https", "2001:db8::7", 9443)),
        ("https://[::1]", ("https", "::1", 443)),
        ("https://gw.example.org:0", ("https", "gw.example.org", 0)),  # no port: not the default one
        ("ftp://gw.example.org", None),
        ("https://", None),
        ("https://[::1", None),  # an unbalanced bracket
        ("https://gw.example.org:99999", None),
        ("gw.example.org", None),
        ("null", None),
    ],
)
def test_url_origin(url: str, origin: tuple[str, str, int] | None) -> None:
    assert url_origin(url) == origin


def test_the_header_values_of_an_origin() -> None:
    assert origin_values(("https", "gw.example.org", 443)) == {"https://gw.example.org", "https://gw.example.org:443"}
    assert origin_values(("http", "gw.example.org", 80)) == {"http://gw.example.org", "http://gw.example.org:80"}
    assert origin_values(("https", "gw.example.org", 80)) == {"https://gw.example.org:80"}  # http's, not https's
    assert origin_values(("https", "2001:db8::7", 9443)) == {"https://[2001:db8::7]:9443"}
    assert host_values(("https", "2001:db8::7", 9443)) == {"[2001:db8::7]:9443", "[2001:db8::7]"}
    assert host_values(("https", "gw.example.org", 443)) == {"gw.example.org:443", "gw.example.org"}
    assert as_host("::1") == "[::1]" and as_host("10.0.0.5") == "10.0.0.5" and as_host("gw") == "gw"
