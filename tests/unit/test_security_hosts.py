"""The Host values the transport guard answers to when no allowed_hosts are configured: an IPv6
literal is written in brackets in a Host header (RFC 9110 §7.2, RFC 3986 §3.2.2), so a gateway bound
to `::1` must allow `[::1]:PORT`, not `::1:PORT` (found in review: every request was answered 421)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.mcp.security import TransportGuard, allowed_hosts


def config(host: str, port: int = 8443, public_url: str | None = None) -> Any:
    return SimpleNamespace(
        allowed_hosts=[],
        allowed_origins=[],
        public_url=public_url,
        host=host,
        port=port,
        max_body_bytes=1 << 20,
        max_inflight_per_client=8,
    )


def test_an_ipv6_bind_allows_its_bracketed_literal() -> None:
    hosts = allowed_hosts(config("::1"))
    assert hosts is not None
    assert {"[::1]:8443", "[::1]"} <= hosts
    assert not {"::1:8443", "::1"} & hosts  # never a Host header's form


def test_an_ipv6_bind_still_allows_the_loopback_names() -> None:
    hosts = allowed_hosts(config("::1"))
    assert hosts is not None and {"localhost:8443", "127.0.0.1:8443"} <= hosts


def test_a_full_ipv6_address_is_bracketed_too() -> None:
    hosts = allowed_hosts(config("fd00::5"))
    assert hosts is not None and {"[fd00::5]:8443", "[fd00::5]"} <= hosts


def test_an_ipv6_public_url_allows_its_bracketed_host_without_the_port() -> None:
    hosts = allowed_hosts(config("::", public_url="https://[2001:db8::7]:9443"))
    assert hosts is not None and {"[2001:db8::7]:9443", "[2001:db8::7]"} <= hosts
    assert "2001:db8::7" not in hosts


def test_ipv4_and_names_are_unchanged() -> None:
    hosts = allowed_hosts(config("127.0.0.1", public_url="https://gw.example:8443"))
    assert hosts == frozenset(
        {
            "127.0.0.1:8443",
            "127.0.0.1",
            "localhost",
            "localhost:8443",
            "gw.example:8443",
            "gw.example",
        }
    )


@pytest.mark.parametrize(("host", "status"), [("[::1]:8443", 200), ("[::1]", 200), ("evil.example:8443", 421)])
async def test_the_guard_answers_a_request_to_an_ipv6_bound_gateway(host: str, status: int) -> None:
    """Through the guard itself: a client of `https://[::1]:8443/` sends `Host: [::1]:8443`."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    guard = TransportGuard(app, config("::1"))
    # no application in the scope: a refusal is answered without an audit row (nothing to write it to)
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/mcp",
        "headers": [(b"host", host.encode())],
        "client": ("::1", 5555),
    }
    await guard(scope, receive, send)
    assert sent[0]["status"] == status
