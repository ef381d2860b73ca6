"""HTTPS to one Proxmox API: an aiohttp connection pool and the two ways a request fails.

httpx over httpcore/anyio cost ~0.5 ms of event-loop CPU per Proxmox request and httpx's own
Request/Response/URL layer another ~0.25 ms (the benchmark's profile); aiohttp's pool does the
same work in C-accelerated code. The `httpx-aiohttp` package was tried and rejected: it maps
a connection dropped after the request was sent to a connect timeout (so a write that may
have run looks like one that never left) and loses the certificate error behind a failed
handshake. Here every failure is one of two kinds, which the runtime's retry and outcome
rules rest on:

- NotSent: nothing reached Proxmox (refused, unresolvable, TLS failure, no connection or
  pool slot in time); the OSError or SSL error is the exception's __cause__.
- AnswerMissing: the request went out and no whole answer came back (dropped, reset, read
  timeout, no whole answer within the request's deadline, a malformed answer): a mutation may
  have run.

Beside those, AnswerTooLarge: the request went out and its answer was over MAX_ANSWER_BYTES, so
it was not read (sent, like AnswerMissing, but no sign of an outage). Every request has an
overall deadline (DEADLINE_FACTOR times the cluster's timeout): the per-read timeout alone
lets an answer that drips a byte at a time run forever.

Query strings and form bodies are encoded as httpx encoded them (booleans as true/false,
lists as repeated keys, spaces as +), and redirects are never followed.
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import yarl

from gateway.core import jsonread

# The largest answers PVE gives are lists that grow with the cluster (/cluster/resources, a
# node's task list or a storage's content, a long task log page): a few MiB for thousands of
# guests. Anything past this is not an answer the gateway can use, and reading it would only
# grow the process.
MAX_ANSWER_BYTES = 64 << 20
# the overall deadline of one request, in multiples of the cluster's timeout (which bounds the
# connect and each read on its own)
DEADLINE_FACTOR = 4
# nesting deeper than this is no Proxmox answer (they nest a few levels) and would only reach
# the recursion limit further on
MAX_JSON_DEPTH = 64
# the gateway's own reachability request (the breaker's probe, the readiness check: request(probe=True)) has
# connections of its own, so callers' slow reads filling the pool never make the API look down to the gateway
PROBE_CONNECTIONS = 2
# whose call a request is for (the principal's `sub`, set by the pipeline before it runs the tool); None:
# the gateway's own. A principal's requests hold at most 1/CALLER_SHARE of a pool's connections: the rest
# of them wait for its own, never in the queue ahead of another principal's. Without it one principal
# within its limits (32 calls in flight, each a composite sending several reads at once) could fill the
# pool and its queue with reads it knows Proxmox is slow to answer, and every other principal's call
# waited behind them and failed `busy`.
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("pvegate_pve_caller", default=None)
CALLER_SHARE = 2


class NotSent(Exception):
    """Nothing was sent. `timeout`: no connection (or free pool slot) within the timeout; `busy`: no
    free pool slot (the gateway's own requests held them all), which says nothing about the API;
    `own` (with busy): the caller's own other requests held its whole share of the pool."""

    def __init__(self, message: str, timeout: bool = False, busy: bool = False, own: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout or busy or own
        self.busy = busy or own
        self.own = own


class _Share:
    """One caller's part of the pool: a semaphore, and how many of its requests use it (gone at 0)."""

    __slots__ = ("slots", "users")

    def __init__(self, size: int) -> None:
        self.slots = asyncio.Semaphore(size)
        self.users = 0


class AnswerMissing(Exception):
    """Sent, and no whole answer came back. `timeout`: none within the read timeout, or (with
    `deadline`) no whole answer within the request's overall deadline."""

    def __init__(self, message: str, timeout: bool = False, deadline: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout or deadline
        self.deadline = deadline


class AnswerTooLarge(Exception):
    """Sent, and the answer was over `limit` bytes: it was not read (a mutation may have run)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    reason: str
    body: bytes

    def json(self) -> Any:
        """The body as strict JSON; ValueError for anything else (NaN, Infinity or an out-of-range
        number, which the reply to the client could not carry; nesting deeper than MAX_JSON_DEPTH)."""
        return jsonread.loads(self.body.decode(), max_depth=MAX_JSON_DEPTH)


def _text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def encode_form(fields: dict[str, Any]) -> str:
    """application/x-www-form-urlencoded, as httpx wrote it: list values become repeated keys."""
    pairs = [(k, _text(item)) for k, v in fields.items() for item in (v if isinstance(v, (list, tuple)) else [v])]
    return urlencode(pairs)


class PveHttp:
    """One keep-alive pool to one API base URL (made on first use, in the running loop)."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        verify: ssl.SSLContext | bool,
        timeout: float,
        max_connections: int = 32,
        max_answer_bytes: int | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._headers = headers
        self._ssl: ssl.SSLContext | bool = verify if isinstance(verify, ssl.SSLContext) else False
        if verify is True:
            self._ssl = ssl.create_default_context()
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        )  # `connect` covers the wait for a pooled connection too: a timeout there sent nothing
        self._limit = max_connections
        self._wait = timeout  # for a free slot, as for a connection
        self._slots = asyncio.Semaphore(max_connections)  # callers' requests
        self._probe_slots = asyncio.Semaphore(PROBE_CONNECTIONS)  # the gateway's own GET /version
        self.share = max(1, max_connections // CALLER_SHARE)  # the most one caller's requests hold
        self._shares: dict[str, _Share] = {}  # callers with a request waiting or sent
        self.deadline = DEADLINE_FACTOR * timeout
        self.max_answer_bytes = MAX_ANSWER_BYTES if max_answer_bytes is None else max_answer_bytes
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    ssl=self._ssl, limit=self._limit + PROBE_CONNECTIONS, limit_per_host=self._limit + PROBE_CONNECTIONS
                ),
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),  # the API token needs no cookies: keep none
                headers=self._headers,
            )
            # aiohttp resends a PUT or DELETE by itself when a reused connection drops after the
            # request was written (RFC 9110 calls them idempotent; Proxmox's resize `+10G` or a
            # firewall rule delete by position are not): the runtime decides what may be sent again
            if not hasattr(self._session, "_retry_connection"):  # aiohttp < 3.11 resends with no way to stop it
                raise RuntimeError("aiohttp >= 3.11 is needed: an older one may resend a PUT or DELETE to Proxmox")
            self._session._retry_connection = False
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        data: dict[str, Any] | None = None,
        *,
        probe: bool = False,
    ) -> Reply:
        """`path` is already percent-encoded (render_path); the URL is used exactly as built. `probe`: the
        gateway's own reachability request, on connections no caller's request takes."""
        url = self._base + path
        if params:
            url += ("&" if "?" in path else "?") + encode_form(params)
        headers = {}
        body: bytes | None = None
        if data:
            body = encode_form(data).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        slots, size = (self._probe_slots, PROBE_CONNECTIONS) if probe else (self._slots, self._limit)
        caller = None if probe else CALLER.get()
        share = None
        if caller is not None:
            share = self._shares.get(caller) or self._shares.setdefault(caller, _Share(self.share))
            share.users += 1
        mine = False  # this request holds one of its caller's slots
        try:
            try:
                async with asyncio.timeout(self._wait):  # both waits together: one timeout, as for a connection
                    if share is not None:
                        await share.slots.acquire()
                        mine = True
                    await slots.acquire()
            except TimeoutError:
                if share is not None and not mine:
                    raise NotSent(
                        f"this principal's other requests held its share ({self.share} of {size}) of the "
                        f"connections to the API for {self._wait:g}s",
                        own=True,
                    ) from None
                raise NotSent(f"all {size} connections to the API stayed busy for {self._wait:g}s", busy=True) from None
            try:
                return await self._send(method, url, headers, body)
            finally:
                slots.release()
        finally:
            if share is not None and caller is not None:
                if mine:
                    share.slots.release()
                share.users -= 1
                if not share.users and self._shares.get(caller) is share:
                    del self._shares[caller]

    async def _send(self, method: str, url: str, headers: dict[str, str], body: bytes | None) -> Reply:
        try:
            async with asyncio.timeout(self.deadline):
                async with self._get_session().request(
                    method, yarl.URL(url, encoded=True), headers=headers, data=body, allow_redirects=False
                ) as resp:
                    return Reply(resp.status, resp.reason or "", await self._read(resp))
        except aiohttp.ClientConnectorCertificateError as exc:  # before ClientConnectorError: a subclass
            raise NotSent(str(exc)) from exc.certificate_error
        except aiohttp.ClientConnectorError as exc:  # refused, unresolvable, TLS handshake
            raise NotSent(str(exc)) from exc.os_error
        except aiohttp.ConnectionTimeoutError as exc:  # no connection (or pool slot) in time
            raise NotSent(str(exc) or "connect timeout", timeout=True) from exc
        except aiohttp.InvalidURL as exc:
            raise NotSent(f"invalid URL {exc}") from exc
        except aiohttp.SocketTimeoutError as exc:
            raise AnswerMissing(str(exc) or "read timeout", timeout=True) from exc
        except aiohttp.ClientError as exc:  # disconnected, reset, payload or protocol error: after sending
            raise AnswerMissing(type(exc).__name__) from exc
        except TimeoutError as exc:  # the request's deadline (aiohttp's own timeouts are caught above)
            raise AnswerMissing(f"no whole answer within {self.deadline:g}s", deadline=True) from exc

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        """The body, refused once it passes the limit (decompressed: the stream is what is counted)."""
        limit = self.max_answer_bytes
        if resp.content_length is not None and resp.content_length > limit:
            resp.close()  # the connection goes with the unread answer
            raise AnswerTooLarge(f"the answer ({resp.content_length} bytes) is over the {limit}-byte limit", limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > limit:
                resp.close()
                raise AnswerTooLarge(f"the answer is over the {limit}-byte limit", limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
