"""A pooled connection the server ended (a fast shutdown, pg_terminate_backend) while it sat idle in the pool.

PostgreSQL sends the idle session a FATAL ErrorResponse ("terminating connection due to administrator
command"), then closes the socket. asyncpg, reading that message while no operation runs, puts its
protocol into an error state; a statement started before the close arrives (under load, the next
BEGIN) fails with `InternalClientError: cannot switch to state 15; another operation (2) is in progress`.
That is the database going away, as a refused connection is: DatabaseUnavailable (the call is refused
with 503 / -32010, readiness learns of it), never an internal error; and the broken connection is not
handed out again.

The window between the message and the close is short; a loopback TCP relay between the pool and a
real PostgreSQL holds the close back, so the test meets it every time (nothing is simulated: every
byte is the server's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from gateway.store.db import DatabaseUnavailable, PostgresDatabase, refusal
from tests.pgserver import PostgresServer
from tests.store.auditstore import new_pg_database

HOLD_CLOSE_SECONDS = 5.0  # how long the relay keeps a client's socket open after the server closed its side


@dataclass
class Relay:
    """127.0.0.1:port -> PostgreSQL, closing a client's side HOLD_CLOSE_SECONDS after the server closed its own."""

    upstream: tuple[str, int]
    port: int = 0
    server_closed: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def release(self) -> None:
        """Hold no close back any more."""
        self._release.set()

    async def stop(self) -> None:
        self.release()
        for w in list(self._writers):  # every relayed socket closed: the pumps end
            with contextlib.suppress(Exception):
                w.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(cwriter)
        try:
            try:
                sreader, swriter = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            self._writers.append(swriter)
            up = asyncio.create_task(self._pump(creader, swriter))
            await self._pump(sreader, cwriter)  # the server's bytes, its FATAL message among them
            self.server_closed.set()
            with contextlib.suppress(TimeoutError):  # the server hung up; the client hears of it later
                await asyncio.wait_for(self._release.wait(), HOLD_CLOSE_SECONDS)
            swriter.close()
            cwriter.close()
            await up
        finally:
            cwriter.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()


@pytest.fixture
async def relayed(postgres: PostgresServer) -> AsyncIterator[tuple[str, str, Relay]]:
    """An upgraded database: its URL, the same through the relay, and the relay."""
    url = await new_pg_database(postgres, "b_")
    parts = urlsplit(url)
    relay = Relay(("127.0.0.1", postgres.port))
    await relay.start()
    via = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{relay.port}"))
    try:
        yield url, via, relay
    finally:
        await relay.stop()


async def _end_session_of(url: str, pid: int) -> None:
    """What a fast shutdown does to each session: FATAL 57P01, then the socket closed."""
    admin = await asyncpg.connect(url)
    try:
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await admin.close()


@pytest.mark.parametrize("how", ["transaction", "fetch"])
async def test_a_session_the_server_ended_in_the_pool_is_a_store_refusal_and_is_not_used_again(
    relayed: tuple[str, str, Relay], how: str
) -> None:
    url, via, relay = relayed
    db = PostgresDatabase(via, max_size=1)  # one connection: the next call gets the broken one, or a new one
    await db.open()
    try:
        async with db.transaction() as tx:
            pid = (await tx.fetch("SELECT pg_backend_pid() AS pid"))[0]["pid"]
        await _end_session_of(url, pid)  # the connection is idle in the pool
        async with asyncio.timeout(10):
            await relay.server_closed.wait()
        await asyncio.sleep(0.2)  # asyncpg has read the FATAL message; the close is still held back
        with pytest.raises(DatabaseUnavailable, match="PostgreSQL cannot be reached") as got:
            if how == "transaction":
                async with db.transaction() as tx:
                    await tx.fetch("SELECT 1 AS one")
            else:
                await db.fetch("SELECT 1 AS one")
        assert isinstance(got.value.__cause__, asyncpg.exceptions.InternalClientError | asyncpg.InterfaceError)
        # the same pool serves at once, on a new session: the broken connection was not handed out again
        # (its socket is still open: the relay holds its close back for seconds)
        async with asyncio.timeout(HOLD_CLOSE_SECONDS / 2):
            async with db.transaction() as tx:
                again = (await tx.fetch("SELECT pg_backend_pid() AS pid"))[0]["pid"]
            assert again != pid
            assert (await db.fetch("SELECT 1 AS one")) == [{"one": 1}]
    finally:
        relay.release()  # closes pass through again (the pool's own, at its close, among them)
        await db.close()


def test_asyncpgs_protocol_state_errors_are_the_store_going_away() -> None:
    """The classification itself, on the exception types asyncpg raises for a connection it can no longer use."""
    broken = asyncpg.exceptions.InternalClientError("cannot switch to state 15; another operation (2) is in progress")
    assert (refusal(broken) or "").startswith("PostgreSQL cannot be reached")
    closed = asyncpg.InterfaceError("connection is closed")
    assert (refusal(closed) or "").startswith("PostgreSQL cannot be reached")
