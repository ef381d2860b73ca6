"""What the Proxmox client makes of answers that are not plain success or plain failure, from a
Proxmox (or a proxy in front of it) that is broken or hostile: a raw HTTP/1.1 server in this module
answers exactly what each test says.

- A mutation answered 596/597/599 (pveproxy: forwarding to the target node failed after the request
  went out) or 502/504 (a reverse proxy) may have run on the node: AnswerLost (recorded interrupted,
  reconciled), never a failure; only 595 (no connection to the node) sent nothing. Reads are unchanged.
- No upstream text brings the API token to the client, and none is longer than ~400 characters.
- An answer over the size limit is not read; a dripping answer ends at the request's deadline; a
  task wait is bounded.
- Malformed answers (NaN, deep nesting, the wrong shape, a redirect, a bad UPID) are tool errors for
  reads and AnswerLost for mutations, never a crash; once a UPID was accepted, any failure to read
  the task's status is AnswerLost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ClusterConfig, SecretRef
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes import transport
from gateway.tools.runtimes.base import AnswerLost, CallContext, TaskFailed, ToolError
from gateway.tools.runtimes.pve_api import PveApiClient, PveApiRuntime, upid_node
from gateway.tools.targets import TargetResolver

TOKEN_ID = "pvegate@pve!gw"
SECRET = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
TOKEN = f"{TOKEN_ID}={SECRET}"
UPID = f"UPID:pve1:00001234:00005678:65000000:qmstart:100:{TOKEN_ID}:"
START = "/nodes/pve1/qemu/100/status/start"
RESOURCES = [
    {"type": "node", "node": "pve1", "status": "online", "id": "node/pve1"},
    {"type": "qemu", "vmid": 100, "node": "pve1", "name": "web", "status": "running", "id": "qemu/100"},
]

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]
# (status, reason, body[, headers]), or a coroutine that writes the answer itself
Answer = tuple[Any, ...] | Writer
Handler = Callable[[str, str, dict[str, str]], Answer | None]


def ok(data: Any) -> Answer:
    return 200, "OK", json.dumps({"data": data}).encode()


def raw(status: int, reason: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
    return status, reason, body, headers or {}


class Upstream:
    """HTTP/1.1 with keep-alive; `handler(method, path, headers)` answers (the path without
    /api2/json), GET /cluster/resources is answered when it does not."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[tuple[str, str]] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, target, _ = head[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
                if int(headers.get("content-length", "0")):
                    await reader.readexactly(int(headers["content-length"]))
                path = target.split("?", 1)[0].removeprefix("/api2/json")
                self.seen.append((method, path))
                answer = self.handler(method, path, headers)
                if answer is None and (method, path) == ("GET", "/cluster/resources"):
                    answer = ok(RESOURCES)
                if answer is None:
                    answer = raw(501, "Not Implemented", b'{"data":null}')
                if callable(answer):
                    await answer(writer)
                    return
                status, reason, body, *more = answer
                extra = more[0] if more else {}
                hdrs = {"Content-Type": "application/json;charset=UTF-8", "Content-Length": str(len(body)), **extra}
                out = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
                writer.write(out.encode("latin-1") + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            return
        finally:
            self.tasks.discard(task)
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/api2/json"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await self.server.wait_closed()

    def sent(self, method: str) -> list[str]:
        return [p for m, p in self.seen if m == method]


def cluster(url: str, tmp_path: Path, timeout: float = 3.0) -> ClusterConfig:
    token_file = tmp_path / "pve-token"
    token_file.write_text(TOKEN)
    return ClusterConfig(
        name="default", api_url=url, token=SecretRef(file=token_file), verify_tls=False, timeout=timeout
    )


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


async def client_call(
    handler: Handler, tmp_path: Path, method: str, path: str, timeout: float = 3.0
) -> tuple[BaseException | Any, Upstream]:
    """One request through PveApiClient: (its data or the exception it raised, the upstream)."""
    up = Upstream(handler)
    async with up as url:
        client = PveApiClient(cluster(url, tmp_path, timeout))
        try:
            res: Any = await asyncio.wait_for(client.request(method, path), 15)
        except Exception as exc:
            res = exc
        finally:
            await client.close()
    return res, up


async def runtime_call(
    handler: Handler, tmp_path: Path, catalog: Catalog, tool: str, args: dict[str, Any]
) -> tuple[BaseException | Any, Upstream]:
    up = Upstream(handler)
    async with up as url:
        client = PveApiClient(cluster(url, tmp_path))
        rt = PveApiRuntime({"default": client}, TargetResolver({"default": client}))
        try:
            res: Any = await asyncio.wait_for(rt.call(catalog.tools[tool], args, CallContext("default")), 15)
        except Exception as exc:
            res = exc
        finally:
            await rt.close()
    return res, up


def answering(method: str, answer: Answer) -> Handler:
    return lambda m, p, h: answer if (m, p) == (method, START) else None


# --- 3: a status after forwarding says nothing about whether the node ran it --------------------


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (596, "Connection timed out"),
        (597, "Connection reset by peer"),
        (599, "Internal error"),
        (502, "Bad Gateway"),
        (504, "Gateway Time-out"),
    ],
)
async def test_a_mutation_answered_after_forwarding_is_answer_lost(status: int, reason: str, tmp_path: Path) -> None:
    res, up = await client_call(answering("POST", raw(status, reason, b"")), tmp_path, "POST", START)
    assert isinstance(res, AnswerLost), res
    assert reason in str(res) and len(up.sent("POST")) == 1  # never sent again


async def test_595_and_reads_after_forwarding_stay_failures(tmp_path: Path) -> None:
    res, _ = await client_call(answering("POST", raw(595, "Connection refused", b"")), tmp_path, "POST", START)
    assert type(res) is ToolError and "unreachable from the API node" in str(res)  # nothing was sent
    res, up = await client_call(answering("GET", raw(596, "Connection timed out", b"")), tmp_path, "GET", START)
    assert type(res) is ToolError and "unreachable from the API node (Connection timed out)" in str(res)
    assert len(up.sent("GET")) == 1


# --- 4: the token never reaches the client through an echo -------------------------------------


def echo(status: int) -> Handler:
    """A proxy that echoes the request's headers, in the reason phrase and in the body's message."""

    def h(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        if path != START:
            return None
        said = f"request header rejected: Authorization: {headers['authorization']} " + "x" * 3000
        return raw(status, said, json.dumps({"data": None, "message": said}).encode())

    return h


@pytest.mark.parametrize(
    ("status", "method"),
    [(400, "GET"), (403, "GET"), (500, "GET"), (501, "GET"), (595, "GET"), (596, "GET"), (596, "POST"), (504, "PUT")],
)
async def test_an_echoed_token_is_scrubbed_and_upstream_text_cut(status: int, method: str, tmp_path: Path) -> None:
    res, _ = await client_call(echo(status), tmp_path, method, START)
    assert isinstance(res, ToolError), res
    text = str(res)
    assert SECRET not in text and TOKEN_ID not in text and "PVEAPIToken=" not in text, text
    assert "[redacted]" in text and len(text) < 600, len(text)


async def test_the_token_is_scrubbed_in_reasons_errors_and_a_failed_task(tmp_path: Path, catalog: Catalog) -> None:
    reason = f"Forbidden for {TOKEN_ID}={SECRET[:20]}"  # an echo cut short in the reason phrase
    res, _ = await client_call(answering("GET", raw(403, reason, b"")), tmp_path, "GET", START)
    assert isinstance(res, ToolError) and SECRET[:8] not in str(res) and TOKEN_ID not in str(res), res

    errors = {"data": None, "errors": {"Authorization": f"bad value PVEAPIToken={TOKEN}"}}
    res, _ = await client_call(answering("GET", raw(400, "Bad", json.dumps(errors).encode())), tmp_path, "GET", START)
    assert (
        isinstance(res, ToolError)
        and SECRET not in str(res)
        and str(res).endswith("Authorization: bad value [redacted]")
    ), res

    def task_fails(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        if method == "POST":
            return ok(UPID)
        if path.endswith("/status"):
            return ok({"status": "stopped", "exitstatus": f"auth {headers['authorization']} {'y' * 1000}"})
        return None

    res, _ = await runtime_call(task_fails, tmp_path, catalog, "vm_start", {"vmid": 100})
    assert isinstance(res, TaskFailed), res
    assert SECRET not in str(res) and "PVEAPIToken" not in str(res) and len(str(res)) < 500, res


# --- 5: answer size and time are bounded --------------------------------------------------------


def big(n: int, chunked: bool) -> Answer:
    body = b'{"data": "' + b"A" * n + b'"}'
    if not chunked:
        return raw(200, "OK", body)

    async def write(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), 65536):
            part = body[i : i + 65536]
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()

    return write


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_answer_over_the_limit_is_not_read(chunked: bool, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1 << 20, raising=False)
    res, up = await client_call(answering("GET", big(2 << 20, chunked)), tmp_path, "GET", START)
    assert type(res) is ToolError and "limit" in str(res), res
    assert len(up.sent("GET")) == 1  # not asked again: it would be as large
    res, up = await client_call(answering("POST", big(2 << 20, chunked)), tmp_path, "POST", START)
    assert isinstance(res, AnswerLost) and "limit" in str(res), res  # sent: it may have run
    res, _ = await client_call(answering("GET", big(1000, chunked)), tmp_path, "GET", START)
    assert res == "A" * 1000


def drip(w: asyncio.StreamWriter) -> Awaitable[None]:
    async def write() -> None:
        w.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"data":"')
        while True:  # each byte well within the read timeout: only an overall deadline ends this
            w.write(b"A")
            await w.drain()
            await asyncio.sleep(0.1)

    return write()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_dripping_answer_ends_at_the_deadline(method: str, tmp_path: Path) -> None:
    t = time.monotonic()
    res, up = await client_call(answering(method, drip), tmp_path, method, START, timeout=0.5)
    assert isinstance(res, AnswerLost) and "no whole answer within 2s" in str(res), res
    assert time.monotonic() - t < 6
    assert len(up.sent(method)) == 1  # a drip is not asked for again


async def test_a_task_wait_is_bounded(tmp_path: Path) -> None:
    def status_drips(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        return drip if path.endswith("/status") else None

    up = Upstream(status_drips)
    async with up as url:
        client = PveApiClient(cluster(url, tmp_path, timeout=0.5))
        rt = PveApiRuntime({"default": client}, TargetResolver({"default": client}))
        t = time.monotonic()
        try:
            with pytest.raises(AnswerLost, match="the status of task UPID:pve1:"):
                await asyncio.wait_for(rt.wait_task(client, UPID, 0.5, []), 15)
        finally:
            await rt.close()
        assert time.monotonic() - t < 6


# --- 6: malformed answers are errors, never crashes ---------------------------------------------

MALFORMED = [
    b'{"data": {"status": "running", "cpu": NaN}}',
    b'{"data": {"mem": Infinity}}',
    b'{"data": {"mem": 1e999}}',
    b'{"data":' + b"[" * 100000 + b"]" * 100000 + b"}",
    b'{"data":' + b"[" * 200 + b"]" * 200 + b"}",
    b'["data"]',
    b'{"message": "no data"}',
    b"not json",
    b"",
]


@pytest.mark.parametrize("body", MALFORMED, ids=range(len(MALFORMED)))
async def test_a_malformed_answer_fails_a_read_and_loses_a_mutation(body: bytes, tmp_path: Path) -> None:
    res, _ = await client_call(answering("GET", raw(200, "OK", body)), tmp_path, "GET", START)
    assert type(res) is ToolError and "not the API's envelope" in str(res), res
    res, _ = await client_call(answering("POST", raw(200, "OK", body)), tmp_path, "POST", START)
    assert isinstance(res, AnswerLost) and "not the API's envelope" in str(res), res


async def test_error_bodies_of_any_shape_are_read(tmp_path: Path) -> None:
    for body in (b'{"errors": ["x"]}', b'{"data":' + b"[" * 100000 + b"]" * 100000 + b"}", b"[1]", b'"x"'):
        res, _ = await client_call(answering("GET", raw(400, "Bad", body)), tmp_path, "GET", START)
        assert type(res) is ToolError and str(res) == "Proxmox answered 400: Bad", res


async def test_a_redirect_is_no_success(tmp_path: Path) -> None:
    answer = raw(307, "Temporary Redirect", json.dumps({"data": UPID}).encode(), {"Location": "http://127.0.0.1:9/"})
    res, up = await client_call(answering("GET", answer), tmp_path, "GET", START)
    assert type(res) is ToolError and "307" in str(res), res
    res, up = await client_call(answering("POST", answer), tmp_path, "POST", START)
    assert isinstance(res, AnswerLost) and "307" in str(res), res
    assert up.seen == [("POST", START)]  # not followed


async def test_an_accepted_task_whose_status_is_unreadable_is_answer_lost(tmp_path: Path, catalog: Catalog) -> None:
    for status in ("stopped", ["stopped"], {"exitstatus": "OK"}, None):

        def h(method: str, path: str, headers: dict[str, str], status: Any = status) -> Answer | None:
            if method == "POST":
                return ok(UPID)
            return ok(status) if path.endswith("/status") else None

        res, _ = await runtime_call(h, tmp_path, catalog, "vm_start", {"vmid": 100})
        assert isinstance(res, AnswerLost) and f"the status of task {UPID}" in str(res), (status, res)

    def failed(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        if method == "POST":
            return ok(UPID)
        return ok({"status": "stopped", "exitstatus": "VM 100 already running"}) if path.endswith("/status") else None

    res, _ = await runtime_call(failed, tmp_path, catalog, "vm_start", {"vmid": 100})
    assert isinstance(res, TaskFailed) and "VM 100 already running" in str(res), res  # an outcome, not a loss


@pytest.mark.parametrize(
    "upid",
    [
        "UPID:..:00001234:00005678:65000000:qmstart:100:root@pam:",
        "UPID:pve1:1:2:3:qmstart:100:x:",
        "UPID:pve1%2F..:00001234:00005678:65000000:qmstart:100:root@pam:",
        UPID + "\n",
        UPID[:-1],
    ],
)
async def test_a_malformed_upid_is_not_followed(upid: str, tmp_path: Path, catalog: Catalog) -> None:
    def h(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        if method == "POST":
            return ok(upid)
        return ok({"status": "stopped", "exitstatus": "OK"}) if "/tasks/" in path else None

    res, up = await runtime_call(h, tmp_path, catalog, "vm_start", {"vmid": 100})
    assert isinstance(res, AnswerLost) and "malformed task id" in str(res), res
    assert not [p for p in up.sent("GET") if "/tasks/" in p]  # no status read on a node it names
    with pytest.raises(ToolError, match="not a Proxmox task id"):
        upid_node(upid)
    assert upid_node(UPID) == "pve1"
