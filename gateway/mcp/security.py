"""Transport guards in front of every route: Host allow-list, Origin check, body cap, per-client concurrency.

A pure ASGI middleware (no BaseHTTPMiddleware: it would add a task per request
on the hot path). It runs before authentication, so a DNS-rebinding page or an
oversize body is refused before any token work, and each refusal is audited (bounded per client
address with the auth failures: store/auth_failures.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.core.config import Config
from gateway.core.headers import repeated as header_repeated
from gateway.core.origins import as_host, host_values, origin_values, url_origin
from gateway.core.text import quoted
from gateway.mcp.jsonrpc import INVALID_REQUEST, error_response
from gateway.store.audit import AuditRecord
from gateway.store.outcomes import STORE_ERRORS

log = logging.getLogger("pvegate.security")

_WILDCARD_HOSTS = {"0.0.0.0", "::", ""}
# Load balancers and orchestrators probe by address (Host: 10.0.0.5:8443, no Origin). These GETs
# take no credential, change nothing and return no secret, so they answer whatever the Host, and a
# misaddressed probe every two seconds does not fill the audit with refusals.
PROBE_PATHS = frozenset({"/livez", "/readyz", "/healthz"})
# How long a client may take to send its body once the headers are in. A request holds one of its
# address's max_inflight_per_client slots while the body arrives, so without a deadline a few
# stalled uploads lock that address out for good.
BODY_DEADLINE_SECONDS = 30.0
# A body not whole this long after the headers is a slow upload: from then on it also needs one of
# its address's upload slots (a quarter of max_inflight_per_client, at least one), or it is refused
# with 429. Bodies sent with their headers, as clients do, never need one, so uploads that stall
# (before authentication: anyone can send them) hold at most that quarter of an address's slots,
# never the ones of requests that came in whole.
SLOW_BODY_SECONDS = 1.0
# Retry-After of a 429 for an address's slots all taken by requests being handled
RETRY_AFTER_BUSY_SECONDS = 1
# the refusals' surface in pvegate_unauthenticated_refusals_total (their audit rows are bounded per client address)
SURFACE = "transport"


def allowed_hosts(config: Config) -> frozenset[str] | None:
    """Host header values we answer to; None means any (wildcard bind without an explicit list)."""
    if config.allowed_hosts:
        return frozenset(h.lower() for h in config.allowed_hosts)
    bound = as_host(config.host)
    hosts = {f"{bound}:{config.port}", bound}
    if config.host in ("127.0.0.1", "localhost", "::1"):
        hosts |= {"localhost", f"localhost:{config.port}", "127.0.0.1", f"127.0.0.1:{config.port}"}
    if config.public_url and (mine := url_origin(config.public_url)) is not None:
        hosts |= host_values(mine)
    if config.host in _WILDCARD_HOSTS and not config.public_url:
        log.warning("listening on a wildcard address with no allowed_hosts or public_url: Host is not checked")
        return None
    return frozenset(h.lower() for h in hosts)


def allowed_origins(config: Config) -> frozenset[str]:
    """Origin header values we answer to (lowercased): the configured ones, and public_url's origin as a
    browser writes it (no default port) or with its default port written, as the console's check takes it."""
    origins = {o.rstrip("/").lower() for o in config.allowed_origins}
    if config.public_url and (mine := url_origin(config.public_url)) is not None:
        origins |= origin_values(mine)
    return frozenset(origins)


class BodyRefused(Exception):
    """The request body is not handed on: too large, cut short, or too slow."""

    def __init__(self, status: int, outcome: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.outcome = outcome
        self.message = message
        self.retry_after = retry_after


class TransportGuard:
    """ASGI middleware: refuses what must never reach a handler, with the HTTP status the spec names."""

    body_deadline: float = BODY_DEADLINE_SECONDS  # class attributes: tests shorten them on the live gateway
    slow_body_after: float = SLOW_BODY_SECONDS

    def __init__(self, app: ASGIApp, config: Config) -> None:
        self.app = app
        self.config = config
        self.hosts = allowed_hosts(config)
        self.origins = allowed_origins(config)
        self.max_body = config.max_body_bytes
        self.max_inflight = config.max_inflight_per_client
        self.max_uploads = max(1, self.max_inflight // 4)
        self.inflight: defaultdict[str, int] = defaultdict(int)
        # per address: when each slow upload holding an upload slot started (at most max_uploads)
        self.uploads: defaultdict[str, list[float]] = defaultdict(list)

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
                scope, receive, send, 421, "host_refused", f"Host {quoted(host)} is not served here", source_ip
            )
            return
        origin = headers.get("origin")
        if origin is not None and header_repeated(scope["headers"], b"origin"):
            # `headers` holds the last copy, a handler reads the first: one request has one origin
            # (RFC 6454 §7.3), so a second copy is refused, whatever either says
            await self._refuse(
                scope, receive, send, 403, "origin_refused", "Origin header appears more than once", source_ip
            )
            return
        if origin is not None and origin.rstrip("/").lower() not in self.origins:
            # A browser page from another origin (DNS rebinding, CSRF) must not reach the tools.
            await self._refuse(
                scope, receive, send, 403, "origin_refused", f"Origin {quoted(origin)} is not allowed", source_ip
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
                retry_after=RETRY_AFTER_BUSY_SECONDS,
            )
            return
        self.inflight[source_ip] += 1
        try:
            if scope["method"] == "POST":
                try:
                    body = await self._read_body(receive, headers, source_ip)
                except BodyRefused as refused:
                    # too slow or cut short: the connection is not reused (RFC 9110 §15.5.9 for the 408)
                    close = refused.status != 413
                    await self._refuse(
                        scope,
                        receive,
                        send,
                        refused.status,
                        refused.outcome,
                        refused.message,
                        source_ip,
                        close=close,
                        retry_after=refused.retry_after,
                    )
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send)
        finally:
            self.inflight[source_ip] -= 1
            if not self.inflight[source_ip]:
                del self.inflight[source_ip]

    async def _read_body(self, receive: Receive, headers: dict[str, str], source_ip: str) -> bytes:
        """_read_capped, and a slow upload's slot: taken once the body is slow_body_after seconds
        late (refused with 429 when its address has none free), given back when it is in or refused."""
        started = time.monotonic()
        taken = False

        def slow() -> int | None:
            """Take an upload slot (None), or say in how many seconds one frees at the latest."""
            nonlocal taken
            uploads = self.uploads[source_ip]
            if len(uploads) < self.max_uploads:
                uploads.append(started)
                taken = True
                return None
            return max(1, math.ceil(min(uploads) + self.body_deadline - time.monotonic()))

        try:
            return await _read_capped(
                receive, headers, self.max_body, self.body_deadline, on_slow=slow, slow_after=self.slow_body_after
            )
        finally:
            if taken:
                uploads = self.uploads[source_ip]
                uploads.remove(started)
                if not uploads:
                    del self.uploads[source_ip]
            elif not self.uploads.get(source_ip, True):
                del self.uploads[source_ip]  # made by a look-up in slow(): no empty entries left behind

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        status: int,
        outcome: str,
        message: str,
        source_ip: str,
        *,
        close: bool = False,
        retry_after: int | None = None,
    ) -> None:
        app = scope.get("app")
        components = getattr(getattr(app, "state", None), "components", None)
        if components is not None:
            record = AuditRecord(
                uuid.uuid4().hex,
                "refusal",
                outcome=outcome,
                body={"reason": message, "source_ip": source_ip, "path": scope.get("path")},
            )
            try:
                # before authentication, so free to send: bounded per client address with the auth
                # failures (store/auth_failures.py), the rest counted and summarised
                await components.auth_failures.record(record, source_ip=source_ip, surface=SURFACE)
            except STORE_ERRORS as exc:  # still refused (nothing ran); the health signal learns of the store
                components.outcomes.store_failed(exc)
        response = error_response(None, INVALID_REQUEST, message, status=status)
        if close:
            response.headers["Connection"] = "close"
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
        await response(scope, receive, send)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _read_capped(
    receive: Receive,
    headers: dict[str, str],
    limit: int,
    deadline: float,
    *,
    on_slow: Callable[[], int | None] | None = None,
    slow_after: float = SLOW_BODY_SECONDS,
) -> bytes:
    """The whole body, or BodyRefused: over `limit` (as soon as that is known, never buffering more),
    cut short (the client left, or fewer bytes than Content-Length said), or not in within `deadline` s.
    With `on_slow`: called once if the body is not in after `slow_after` s; a number it returns
    refuses the upload at once (429, that number as Retry-After).

    A body cut short is never handed on: a truncated request could still parse as another one."""
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BodyRefused(413, "body_too_large", f"request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    refused_after: int | None = None
    timer: asyncio.TimerHandle | None = None
    try:
        async with asyncio.timeout(deadline) as window:
            if on_slow is not None:
                loop = asyncio.get_running_loop()

                def slow() -> None:
                    nonlocal refused_after
                    refused_after = on_slow()
                    if refused_after is not None:
                        window.reschedule(loop.time())  # no upload slot free: the wait ends now

                timer = loop.call_later(slow_after, slow)
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise BodyRefused(
                        400, "body_incomplete", "the connection closed before the request body was complete"
                    )
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise BodyRefused(413, "body_too_large", f"request body exceeds {limit} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError as exc:
        if refused_after is not None:
            raise BodyRefused(
                429, "too_many_requests", "too many slow uploads from this client", retry_after=refused_after
            ) from exc
        raise BodyRefused(
            408, "body_timeout", f"the request body was not complete within {deadline:g} seconds"
        ) from exc
    finally:
        if timer is not None:
            timer.cancel()
    if declared is not None and size != int(declared):
        raise BodyRefused(
            400, "body_incomplete", f"the request body has {size} bytes, Content-Length declared {declared}"
        )
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
