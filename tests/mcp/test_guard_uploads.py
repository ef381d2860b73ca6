"""The transport guard's per-address budgets on their own (no gateway): requests being handled
and slow uploads are counted apart, and every 429 says when to retry."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.mcp.security import TransportGuard

HOST = "127.0.0.1:8443"
BODY = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


def guard(app: Any, max_inflight: int) -> TransportGuard:
    config: Any = SimpleNamespace(
        allowed_hosts=[HOST],
        allowed_origins=[],
        public_url=None,
        host="127.0.0.1",
        port=8443,
        max_body_bytes=1 << 20,
        max_inflight_per_client=max_inflight,
    )
    g = TransportGuard(app, config)
    g.body_deadline = 2.0
    g.slow_body_after = 0.2
    return g


def scope(length: int = len(BODY)) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(b"host", HOST.encode()), (b"content-length", str(length).encode())],
        "client": ("10.0.0.7", 5555),
    }


def whole() -> Receive:
    async def receive() -> Message:
        return {"type": "http.request", "body": BODY, "more_body": False}

    return receive


def stalled() -> Receive:
    async def receive() -> Message:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return receive


class Reply:
    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")


class Held:
    """An app that answers 200 once released: requests being handled, for as long as a test likes."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        await receive()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def run(g: TransportGuard, receive: Receive, length: int = len(BODY)) -> Reply:
    reply = Reply()
    await g(scope(length), receive, reply)
    return reply


async def test_every_slot_busy_is_429_with_retry_after() -> None:
    app = Held()
    g = guard(app, max_inflight=2)
    handled = [asyncio.create_task(run(g, whole())) for _ in range(2)]
    while app.entered < 2:
        await asyncio.sleep(0.01)
    busy = await run(g, whole())
    assert busy.status == 429 and busy.headers.get("retry-after") == "1", busy.headers
    assert json.loads(busy.body)["error"]["message"] == "too many concurrent requests from this client"
    app.release.set()
    assert [r.status for r in await asyncio.gather(*handled)] == [200, 200]
    assert not g.inflight and not g.uploads


async def test_slow_uploads_get_a_quarter_of_the_slots_and_whole_requests_the_rest() -> None:
    app = Held()
    app.release.set()
    g = guard(app, max_inflight=8)  # two upload slots
    assert g.max_uploads == 2
    uploads = [asyncio.create_task(run(g, stalled(), length=1000)) for _ in range(6)]
    await asyncio.sleep(0.5)  # past slow_body_after: two hold an upload slot, four were refused
    refused = [t.result() for t in uploads if t.done()]
    assert len(refused) == 4
    for r in refused:
        assert r.status == 429 and r.headers.get("connection") == "close", r.headers
        assert 1 <= int(r.headers["retry-after"]) <= 2, r.headers  # the oldest upload's deadline
        assert json.loads(r.body)["error"]["message"] == "too many slow uploads from this client"
    assert len(g.uploads["10.0.0.7"]) == 2 and g.inflight["10.0.0.7"] == 2
    # requests whose body comes with their headers are served meanwhile, all six free slots at once
    served = await asyncio.gather(*(run(g, whole()) for _ in range(6)))
    assert [r.status for r in served] == [200] * 6
    timed_out = await asyncio.gather(*[t for t in uploads if not t.done()])
    assert [r.status for r in timed_out] == [408, 408]
    assert not g.inflight and not g.uploads  # every slot given back


@pytest.mark.parametrize("late", [0.05, 0.4])
async def test_a_body_in_before_the_deadline_is_served_slow_or_not(late: float) -> None:
    app = Held()
    app.release.set()
    g = guard(app, max_inflight=4)
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            await asyncio.sleep(late)
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    reply = await run(g, receive)
    assert reply.status == 200
    assert not g.inflight and not g.uploads
