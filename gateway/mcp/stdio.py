"""MCP over stdio for one locally configured principal (`pvegate stdio`).

A desktop MCP client starts pvegate as a subprocess and exchanges newline-delimited
JSON-RPC messages on its stdin/stdout (the MCP stdio transport). There is no network
listener and no bearer token: the principal is the `local_principals` entry named on
the command line, and the operating system's process boundary is the authentication.
Everything after that is the HTTP transport's own path: the same parser
(`jsonrpc.parse_message`), the same `initialize` answer, the same methods
(`methods.list_tools`, `methods.call`, `modern.dispatch`), hence the same pipeline:
one OPA decision, the audit on disk before Proxmox hears of it, and approvals handed
off by URL.

Framing is ours, not the SDK's `stdio_server`: that one parses into the SDK's models,
while the shared handlers take the raw message so that faults (batches, invalid
Unicode, unknown methods) are answered exactly as over HTTP. stdout carries only
protocol messages; logs go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from gateway.components import Components
from gateway.core.config import LocalPrincipal
from gateway.core.principal import Principal
from gateway.mcp import handoff, methods, modern, principal_limits, transport
from gateway.mcp.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Message,
    RpcFault,
    encode,
    parse_message,
)
from gateway.mcp.request_state import RequestStates, Sealer
from gateway.store.audit import AuditRecord
from gateway.store.outcomes import AUDIT_UNAVAILABLE, STORE_ERRORS, AuditUnavailable

log = logging.getLogger("pvegate.stdio")

ISSUER = "pvegate-local"  # principal.iss of a local principal: no token issued it


class _TooLong:
    """What _Lines.next gives for a line over the limit: no bytes at all, so no line a client sends can
    pass for it (a byte string marker did: a 9-byte line of its bytes was refused as over-long)."""


TOO_LONG = _TooLong()
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"


def local_principal(p: LocalPrincipal) -> Principal:
    return Principal(sub=p.name, iss=ISSUER, roles=p.roles, groups=p.groups, scopes=(), client_id="stdio", kind=p.kind)


def _is_modern(msg: Message) -> bool:
    """The 2026-07-28 revision has no handshake: each request names its version in `_meta`."""
    if msg.method == "server/discover":
        return True
    meta = msg.params.get("_meta")
    version = meta.get(PROTOCOL_VERSION_META) if isinstance(meta, dict) else None
    return version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS


class StdioSession:
    """One client on stdin/stdout: a handshake-era session (the version and capabilities
    declared at `initialize` hold until the process ends), or stateless 2026-07-28 requests."""

    def __init__(self, c: Components, principal: Principal) -> None:
        self.c = c
        self.principal = principal
        self.version: str | None = None
        self.url_elicitation = False  # declared at initialize (capabilities.elicitation.url)
        self.states = RequestStates(Sealer())  # one process, one client: a key of its own

    def _exchange(self, version: str, modern_era: bool, url_elicitation: bool) -> methods.Exchange:
        return methods.Exchange(self.c, self.principal, version, modern_era, None, url_elicitation, self.states)

    async def handle(self, line: bytes) -> dict[str, Any] | None:
        """One message in; the reply document, or None for a notification. Never raises: the client
        waits for a reply to each request, so an audit that cannot take writes, or a bug, is answered
        too: AUDIT_UNAVAILABLE as over HTTP, or INTERNAL_ERROR without internals (the log has them)."""
        msg: Message | None = None
        reply_id: str | int | None = None
        try:
            try:
                msg = parse_message(line)
                reply_id = msg.id
                if msg.is_notification:
                    transport.refuse_request_without_id(msg)  # a tools/call without an id: told, not dropped
                    return None  # notifications/initialized, cancelled, ...: nothing to answer
                return {"jsonrpc": "2.0", "id": msg.id, "result": await self._dispatch(msg)}
            except RpcFault as fault:
                if fault.id is None:
                    fault.id = reply_id
                reply_id = fault.id
                if not fault.audited:
                    await self._refuse(fault)
                return _error(fault.id, fault.code, fault.message, fault.data)
        except (AuditUnavailable, *STORE_ERRORS) as exc:  # fail closed, and say why
            message = transport.audit_unavailable_message(self.c, exc)
            return None if msg is not None and msg.is_notification else _error(reply_id, AUDIT_UNAVAILABLE, message)
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("internal error handling a stdio message (request %s)", request_id)
            if msg is not None and msg.is_notification:
                return None
            return _error(reply_id, INTERNAL_ERROR, f"Internal error (request {request_id})")

    async def _dispatch(self, msg: Message) -> dict[str, Any]:
        if _is_modern(msg):
            version, capabilities = modern.classify(msg, None, ())
            x = self._exchange(version, True, modern.wants_url_elicitation(capabilities))
            return await modern.dispatch(x, msg)
        if msg.method == "initialize":
            self.version, result = transport.initialize_result(msg)
            self.url_elicitation = self.version >= "2025-11-25" and handoff.url_elicitation_declared(
                msg.params.get("capabilities")
            )
            return result
        if msg.method == "ping":
            return {}
        x = self._exchange(self.version or transport.DEFAULT_VERSION, False, self.url_elicitation)
        if msg.method == "tools/list":
            return await methods.list_tools(x)
        if msg.method == "tools/call":
            return await methods.call(x, msg.params)
        raise RpcFault(METHOD_NOT_FOUND, f"Method not found: {msg.method}", id_=msg.id)

    async def refuse_too_long(self, limit: int) -> dict[str, Any]:
        """The reply to a line over the limit: nothing of it was parsed, so no id to answer (as an
        HTTP 413 has none). Audited first; an audit that cannot take it is said instead."""
        try:
            await self._refuse(RpcFault(INVALID_REQUEST, "message larger than max_body_bytes"))
        except (AuditUnavailable, *STORE_ERRORS) as exc:
            return _error(None, AUDIT_UNAVAILABLE, transport.audit_unavailable_message(self.c, exc))
        return too_long_reply(limit)

    async def _refuse(self, fault: RpcFault) -> None:
        """A protocol-level refusal is audited like one over HTTP (there is no source address), and counts
        against the principal's refusal budget as there: over it, only counted (store/principal_limits.py)."""
        limits, sub = self.c.principal_limits, self.principal.sub
        refusal = principal_limits.counts(fault)
        if refusal and await limits.over_budget(sub, "protocol_error"):
            return
        if refusal:  # counted before it is written: faults sent at once see each other
            limits.refused(sub)
        body = {"transport": "stdio", "code": fault.code, "reason": fault.message}
        await self.c.audit.append(AuditRecord(uuid.uuid4().hex, "refusal", sub, None, None, "protocol_error", body))


def _pollable(stream: BinaryIO) -> bool:
    """Whether the event loop can wait on `stream`: a pipe, a socket or a terminal. Anything else (a regular
    file, /dev/null or another character device) epoll refuses, and asyncio would only log that from a
    callback and never see the end of input: those are read in a thread."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError):  # no descriptor (io.UnsupportedOperation is both)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))


class _Lines:
    """Newline-delimited messages from a binary stream, each at most `limit` bytes."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.reader: asyncio.StreamReader | None = None

    async def open(self) -> None:
        if not _pollable(self.stream):  # a regular file (`pvegate stdio < requests.jsonl`), /dev/null: a thread
            self.reader = None
            return
        reader = asyncio.StreamReader(limit=self.limit + 1)
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), self.stream)
            self.reader = reader
        except (ValueError, OSError):
            self.reader = None

    async def next(self) -> bytes | _TooLong | None:
        """The next line (without its newline), TOO_LONG for an over-long one, None at end of input."""
        if self.reader is None:
            line = await asyncio.to_thread(self.stream.readline, self.limit + 2)
            if not line:
                return None
            if not line.endswith(b"\n") and len(line) > self.limit:
                while (rest := await asyncio.to_thread(self.stream.readline, 65536)) and not rest.endswith(b"\n"):
                    pass
                return TOO_LONG
            return self._within(line.rstrip(b"\r\n"))
        try:
            line = await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:  # end of input, maybe a last line without newline
            return self._within(exc.partial.rstrip(b"\r")) if exc.partial else None
        except asyncio.LimitOverrunError:
            while True:  # drop the rest of the over-long line
                try:
                    await self.reader.readuntil(b"\n")
                    return TOO_LONG
                except asyncio.LimitOverrunError as exc:
                    await self.reader.readexactly(exc.consumed)
                except asyncio.IncompleteReadError:
                    return TOO_LONG
        return self._within(line.rstrip(b"\r\n"))

    def _within(self, line: bytes) -> bytes | _TooLong:
        """The line, or TOO_LONG past `limit` bytes (the readers let one byte more through: their bound
        counts the newline), as HTTP refuses a body past max_body_bytes."""
        return TOO_LONG if len(line) > self.limit else line


async def serve_stdio(
    c: Components,
    principal: Principal,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    *,
    on_ready: Callable[[], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Answer messages from stdin on stdout until stdin closes, `stop` is set (a stop signal) or stdout
    is gone (the client closed its end); requests run concurrently (at most `max_inflight_per_client`),
    replies are written whole, one per line.

    At the end of input every request asked is let finish. On `stop`, or a stdout that takes no more,
    no more input is read, and the requests running get `shutdown_grace_seconds` to finish (outcomes
    written, replies sent while stdout takes them); calls still waiting on Proxmox then are cut off and
    recorded `interrupted` (settled later from Proxmox), as `pvegate serve` drains."""
    out = stdout or sys.stdout.buffer
    lines = _Lines(stdin or sys.stdin.buffer, c.config.max_body_bytes)
    await lines.open()
    stopping = stop if stop is not None else asyncio.Event()
    writer = _Out(out, stopping)
    await writer.open()
    try:
        session = StdioSession(c, principal)
        write_lock = asyncio.Lock()
        slots = asyncio.Semaphore(max(1, c.config.max_inflight_per_client))
        running: set[asyncio.Task[None]] = set()
        gone = False  # stdout takes no more writes: the client has gone

        async def reply(doc: dict[str, Any]) -> None:
            nonlocal gone
            async with write_lock:
                if gone:
                    return
                data = encode(doc) + b"\n"  # outside the try: only a failed write means the client has gone
                try:
                    await writer.write(data)
                except (OSError, ValueError) as exc:  # EPIPE: the client closed its end (ValueError: stdout closed)
                    gone = True
                    log.warning(
                        "stdout is closed (%s): no more input is read; calls running finish", type(exc).__name__
                    )
                    writer.discard()
                    stopping.set()

        async def one(line: bytes) -> None:
            # the slot is held until the reply is written: a client that reads no replies gets no more
            # requests read, rather than replies piling up in memory
            try:
                try:
                    doc = await session.handle(line)  # answers its own failures too
                except Exception:  # a last resort: never a stack trace on stdout; the log has it
                    log.exception("internal error handling a stdio message")
                    doc = None
                if doc is not None:
                    await reply(doc)
            finally:
                slots.release()

        async def too_long() -> None:
            try:
                await reply(await session.refuse_too_long(c.config.max_body_bytes))
            finally:
                slots.release()

        async def read() -> None:
            """Until the end of input; cancelled on `stop`. Its awaits (the next line, a free slot) are
            safe to cancel: whatever a message starts runs in a task of its own."""
            while (line := await lines.next()) is not None:
                if isinstance(line, bytes) and not line.strip():
                    continue
                await slots.acquire()
                task = asyncio.create_task(one(line) if isinstance(line, bytes) else too_long())
                running.add(task)
                task.add_done_callback(running.discard)

        if on_ready is not None:
            await on_ready()
        reading = asyncio.create_task(read(), name="stdio-read")
        try:
            await _until(stopping, {reading})
        finally:
            reading.cancel()  # a stop: no more input is read
            try:
                await reading
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # stdin failing (EIO on a hung-up tty) ends input as its close does
                log.warning("stdin failed (%s): no more input is read; calls running finish", type(exc).__name__)
        # stdin closed: let what was asked finish (its audit rows included), unless a stop comes meanwhile
        await _until(stopping, running)
        if stopping.is_set():
            await _finish(c, running)
        await writer.close()
    finally:  # a stdout the loop made non-blocking is given back as it was, however this ends
        writer.restore()


async def _until(stop: asyncio.Event, tasks: set[asyncio.Task[None]]) -> None:
    """Until every one of `tasks` (a live set: tasks may join it) is done or `stop` is set; none is cancelled."""
    stopped = asyncio.create_task(stop.wait(), name="stdio-stop")
    try:
        while not stop.is_set() and (live := {t for t in tasks if not t.done()}):
            await asyncio.wait({*live, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopped


CUT_WAIT_SECONDS = 10.0  # after the cut: for the calls cut off to record `interrupted` and answer
DRAIN_AFTER_STOP_SECONDS = 2.0  # after a stop: for the replies queued to reach a client that reads


async def _finish(c: Components, running: set[asyncio.Task[None]]) -> None:
    """A stop: the requests running get the grace period, then what still waits on Proxmox is cut off
    (Outcomes.cut: recorded `interrupted`; a call not yet sent is not sent) and given a moment to say so."""
    outcomes = c.outcomes
    outcomes.draining = True
    pending = set(running)
    log.warning(
        "stopping: %d request(s) running, grace period %gs; no more input is read",
        len(pending),
        outcomes.grace_seconds,
    )
    if pending:
        _, pending = await asyncio.wait(pending, timeout=outcomes.grace_seconds)
    if pending:
        log.error("grace period ended: cutting off %d request(s) running", len(pending))
        outcomes.cut()
        _, pending = await asyncio.wait(pending, timeout=CUT_WAIT_SECONDS)
    for task in pending:  # nothing of it reaches Proxmox any more (cutting): stop waiting for it
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    await outcomes.flush()


class _OutProtocol(asyncio.BaseProtocol):
    """Flow control of stdout's pipe: paused while its buffer is over the high-water mark."""

    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost = asyncio.Event()
        self.error: Exception | None = None

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.error = exc
        self.lost.set()
        self.writable.set()


class _Out:
    """Replies to stdout. A pipe is written through the event loop: a client that stops
    reading holds back the replies, never the process (a blocking write from the loop froze it whole,
    found in review: no call made progress and a stop signal was never handled, so the client's
    SIGTERM went unheard until it killed the process). Written through a duplicate of the descriptor,
    so that closing it never frees fd 1 for another file. Any other descriptor (a socket, a terminal, a
    regular file, /dev/null) is written whole on it (_write_fd); a test's buffer as it is."""

    def __init__(self, stream: BinaryIO, stopping: asyncio.Event) -> None:
        self.stream = stream
        self.stopping = stopping  # after a stop a reply no longer waits for the client to read
        self.transport: asyncio.WriteTransport | None = None
        self.protocol: _OutProtocol | None = None
        self.fd: int | None = None  # anything else with a descriptor: written on it (_write_fd)

    async def open(self) -> None:
        try:
            fd = self.stream.fileno()
            mode = os.fstat(fd).st_mode
        except (OSError, ValueError):
            return
        # a pipe only: a socket's write transport takes any readable event for the peer closing, and a
        # socket is often stdin too (socat, inetd, systemd Accept=yes), whose requests are readable on it
        if not stat.S_ISFIFO(mode):
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()  # whatever was buffered before goes first
                self.fd = fd
            return
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()  # whatever was buffered before goes first
            dup = os.fdopen(os.dup(fd), "wb", buffering=0)
            try:
                loop = asyncio.get_running_loop()
                transport, protocol = await loop.connect_write_pipe(_OutProtocol, dup)
            except (OSError, ValueError):
                dup.close()
                return
            self.transport, self.protocol = transport, protocol

    async def write(self, data: bytes) -> None:
        """Written, or queued while the client catches up (after a stop: queued, not waited for);
        OSError once the client has gone."""
        if self.fd is not None:
            await self._write_fd(self.fd, data)
            return
        if self.transport is None or self.protocol is None:
            self.stream.write(data)
            self.stream.flush()
            return
        if self.protocol.lost.is_set() or self.transport.is_closing():
            raise BrokenPipeError("stdout is closed")
        self.transport.write(data)
        if not self.protocol.writable.is_set():
            waiting = asyncio.create_task(_wait_event(self.protocol.writable))
            try:
                await _until(self.stopping, {waiting})
            finally:
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        if self.protocol.lost.is_set():
            raise self.protocol.error if isinstance(self.protocol.error, OSError) else BrokenPipeError()

    async def _write_fd(self, fd: int, data: bytes) -> None:
        """All of `data`, on the descriptor. A socket or terminal that is stdin too was made non-blocking by the
        loop reading stdin: a full buffer is waited out, not taken for a client gone (found in review: through
        the buffered stream, a socket client slow to read got one reply cut mid-line and the others dropped,
        silently). After a stop the wait is bounded; then TimeoutError, and the client is taken as gone."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                await self._writable(fd)

    async def _writable(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        loop.add_writer(fd, ready.set)
        waiting = asyncio.create_task(_wait_event(ready))
        try:
            await _until(self.stopping, {waiting})
            if not ready.is_set():  # a stop: a moment more for the client to read, not forever
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ready.wait(), DRAIN_AFTER_STOP_SECONDS)
        finally:
            loop.remove_writer(fd)
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        if not ready.is_set():
            raise TimeoutError("stdout takes no more")

    def discard(self) -> None:
        if self.transport is not None and not self.transport.is_closing():  # closing: lost is on its way
            self.transport.abort()
        _discard(self.stream)

    async def close(self) -> None:
        """What is queued is written before the end, while the client reads it; after a stop, for
        DRAIN_AFTER_STOP_SECONDS at most (the calls' outcomes are recorded: only replies are lost)."""
        stopping = self.stopping
        if self.transport is None or self.protocol is None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.flush()
            return
        self.transport.close()  # writes what is queued, then lost
        lost = self.protocol.lost
        if not stopping.is_set():  # until it is written, or a stop
            waiting = asyncio.create_task(_wait_event(lost))
            try:
                await _until(stopping, {waiting})
            finally:
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        if not lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), DRAIN_AFTER_STOP_SECONDS)
        if not lost.is_set():
            log.warning("stdout takes no more: %d byte(s) of replies dropped", self.transport.get_write_buffer_size())
            self.transport.abort()

    def restore(self) -> None:
        """The loop made stdout's open file non-blocking, for every process sharing it: blocking again."""
        if self.transport is None:
            return
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(self.stream.fileno(), True)


async def _wait_event(event: asyncio.Event) -> None:
    await event.wait()


def _discard(stream: BinaryIO) -> None:
    """Point a dead stdout at /dev/null: what is still buffered, flushed again at exit, would otherwise
    end in an "Exception ignored ... BrokenPipeError" on stderr."""
    with contextlib.suppress(OSError, ValueError):
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)


def _error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def too_long_reply(limit: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": INVALID_REQUEST, "message": f"Invalid Request: a message may be at most {limit} bytes"},
    }
