"""Transport guards in front of every route: Host allow-list, Origin check, body cap, per-client concurrency.

A pure ASGI middleware (no BaseHTTPMiddleware: it would add a task per request
on the hot path). It runs before authentication, so a DNS-rebinding page or an
oversize body is refused before any token work, and each refusal is audited.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.core.config import Config
from gateway.mcp.jsonrpc import INVALID_REQUEST, error_response
from gateway.store.audit import AuditRecord
from gateway.store.outcomes import STORE_ERRORS

log = logging.getLogger("pvegate.security")

_WILDCARD_HOSTS = {"0.0.0.0", "::", ""}
# Load balancers and orchestrators probe by address (Host: 10.0.0.5:8443, no Origin). These GETs
# take no credential, change nothing and return no secret, so they answer whatever the Host, and a
# misaddressed probe every two seconds does not fill the audit with refusals.
PROBE_PATHS = frozenset({"/livez", "/readyz", "/healthz"})


def _host_only(value: str) -> str:
    """'example:8443' -> 'example'; '[::1]:8443' -> '::1'."""
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_hosts(config: Config) -> frozenset[str] | None:
    """Host header values we answer to; None means any (wildcard bind without an explicit list)."""
    if config.allowed_hosts:
        return frozenset(h.lower() for h in config.allowed_hosts)
    hosts = {f"{config.host}:{config.port}", config.host}
    if config.host in ("127.0.0.1", "localhost", "::1"):
        hosts |= {"localhost", f"localhost:{config.port}", "127.0.0.1", f"127.0.0.1:{config.port}"}
    if config.public_url:
        netloc = urlsplit(config.public_url).netloc
        hosts |= {netloc, _host_only(netloc)}
    if config.host in _WILDCARD_HOSTS and not config.public_url:
        log.warning("listening on a wildcard address with no allowed_hosts or public_url: Host is not checked")
        return None
    return frozenset(h.lower() for h in hosts)


def allowed_origins(config: Config) -> frozenset[str]:
    origins = {o.rstrip("/").lower() for o in config.allowed_origins}
    if config.public_url:
        parts = urlsplit(config.public_url)
        origins.add(f"{parts.scheme}://{parts.netloc}".lower())
    return frozenset(origins)


class TransportGuard:
    """ASGI middleware: refuses what must never reach a handler, with the HTTP status the spec names."""

    def __init__(self, app: ASGIApp, config: Config) -> None:
        self.app = app
        self.config = config
        self.hosts = allowed_hosts(config)
        self.origins = allowed_origins(config)
        self.max_body = config.max_body_bytes
        self.max_inflight = config.max_inflight_per_client
        self.inflight: defaultdict[str, int] = defaultdict(int)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in PROBE_PATHS and scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        client = scope.get("client")
        source_ip = client[0] if client else "unknown"
        host = headers.get("host", "").lower()
        if self.hosts is not None and host not in self.hosts:
            await self._refuse(
                scope, receive, send, 421, "host_refused", f"Host {host!r} is not served here", source_ip
            )
            return
        origin = headers.get("origin")
        if origin is not None and origin.rstrip("/").lower() not in self.origins:
            # A browser page from another origin (DNS rebinding, CSRF) must not reach the tools.
            await self._refuse(
                scope, receive, send, 403, "origin_refused", f"Origin {origin!r} is not allowed", source_ip
            )
            return
        if self.inflight[source_ip] >= self.max_inflight:
            await self._refuse(
                scope,
                receive,
                send,
                429,
                "too_many_requests",
                "too many concurrent requests from this client",
                source_ip,
            )
            return
        self.inflight[source_ip] += 1
        try:
            if scope["method"] == "POST":
                body = await _read_capped(receive, headers, self.max_body)
                if body is None:
                    await self._refuse(
                        scope,
                        receive,
                        send,
                        413,
                        "body_too_large",
                        f"request body exceeds {self.max_body} bytes",
                        source_ip,
                    )
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send)
        finally:
            self.inflight[source_ip] -= 1
            if not self.inflight[source_ip]:
                del self.inflight[source_ip]

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, outcome: str, message: str, source_ip: str
    ) -> None:
        app = scope.get("app")
        components = getattr(getattr(app, "state", None), "components", None)
        if components is not None:
            try:
                await components.audit.append(
                    AuditRecord(
                        uuid.uuid4().hex,
                        "refusal",
                        outcome=outcome,
                        body={"reason": message, "source_ip": source_ip, "path": scope.get("path")},
                    )
                )
            except STORE_ERRORS as exc:  # still refused (nothing ran); the health signal learns of the store
                components.outcomes.store_failed(exc)
        await error_response(None, INVALID_REQUEST, message, status=status)(scope, receive, send)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_capped(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed `limit` (never buffers more)."""
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, upstream: Receive) -> Callable[[], Awaitable[Message]]:
    """Hand the buffered body to the app once, then pass through (so a real disconnect still shows)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return dict(await upstream())
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive
