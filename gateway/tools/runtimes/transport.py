"""The Proxmox API client's transport: httpx's API over an aiohttp connection pool.

httpx's own transport (httpcore over anyio) cost ~1 ms of event-loop CPU per Proxmox
request in the benchmark's profile, the largest single item of a call; aiohttp's pool does
the same work in C-accelerated code. The `httpx-aiohttp` package was tried and rejected: it
maps a connection dropped after the request was sent to a connect timeout (so a write that
may have run looks like one that never left) and loses the certificate error behind a
failed handshake. This adapter keeps the distinction the runtime's retry rules depend on:

- nothing was sent (refused, unresolvable, TLS failure, no connection in time)
  -> httpx.ConnectError / httpx.ConnectTimeout, the underlying OSError or SSL error as cause;
- sent, answer lost (dropped, reset, read timeout) -> httpx.RemoteProtocolError / httpx.ReadTimeout.

Redirects are never followed and bodies are decoded by httpx (aiohttp's decompression is
off), so a response looks exactly as httpx's own transport would have returned it.
"""

from __future__ import annotations

import ssl

import aiohttp
import httpx

# Hop-by-hop and framing headers aiohttp sets itself from the URL and the body.
_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport over one aiohttp ClientSession (made on first use, in the running loop)."""

    def __init__(self, verify: ssl.SSLContext | bool, timeout: float, max_connections: int) -> None:
        self._ssl: ssl.SSLContext | bool = verify if isinstance(verify, ssl.SSLContext) else bool(verify)
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        )  # connect covers waiting for a pooled connection too: a timeout there sent nothing
        self._limit = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ssl_arg: ssl.SSLContext | bool = self._ssl if isinstance(self._ssl, ssl.SSLContext) else False
            if self._ssl is True:
                ssl_arg = ssl.create_default_context()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ssl_arg, limit=self._limit, limit_per_host=self._limit),
                timeout=self._timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),  # PVE's API token needs no cookies; keep none
                skip_auto_headers=("User-Agent", "Accept-Encoding"),  # httpx's own are passed through
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._get_session()
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _OWN_HEADERS]
        body = await request.aread()
        try:
            async with session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                compress=None,
            ) as resp:
                content = await resp.read()
                return httpx.Response(
                    status_code=resp.status,
                    headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers],
                    content=content,
                    request=request,
                    extensions={"reason_phrase": (resp.reason or "").encode("latin-1", "replace")},
                )
        except aiohttp.ClientConnectorCertificateError as exc:  # before ClientConnectorError: a subclass
            raise httpx.ConnectError(str(exc), request=request) from exc.certificate_error
        except aiohttp.ClientConnectorError as exc:  # refused, unresolvable, TLS handshake: nothing sent
            raise httpx.ConnectError(str(exc), request=request) from exc.os_error
        except aiohttp.ConnectionTimeoutError as exc:  # no connection (or pool slot) in time: nothing sent
            raise httpx.ConnectTimeout(str(exc) or "connect timeout", request=request) from exc
        except aiohttp.SocketTimeoutError as exc:  # sent, no answer in time
            raise httpx.ReadTimeout(str(exc) or "read timeout", request=request) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:  # sent, answer lost
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
        except aiohttp.ClientOSError as exc:  # reset or broken pipe on an open connection: sent
            raise httpx.RemoteProtocolError(str(exc) or type(exc).__name__, request=request) from exc
        except aiohttp.ClientResponseError as exc:  # a malformed answer
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc
        except aiohttp.InvalidURL as exc:
            raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.TransportError(str(exc) or type(exc).__name__, request=request) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
