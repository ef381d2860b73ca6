"""Transport guards at their exact edges (gateway/security.py), through the live gateway.

Planted in review and not caught before: an Origin check by prefix (so
`<public_url>.evil.example` passed), and a body cap off by one.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.types import Message, Receive

from gateway.dev.devenv import DevEnv
from gateway.mcp.security import BodyRefused, TransportGuard, _read_capped
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.support import GatewayThread, audit_rows

LIST = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=60) as client:
        yield client


def headers(env: DevEnv, **extra: str) -> dict[str, str]:
    h = {
        "authorization": f"Bearer {env.token('guard-agent', ['operator'])}",
        "accept": "application/json",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-06-18",
    }
    h.update(extra)
    return h


def look_alikes(public_url: str) -> list[str]:
    """Origins that start with (or resemble) the allowed one but are another site."""
    host = public_url.split("://", 1)[1]
    return [
        public_url + ".evil.example",
        public_url + "0",  # another port
        public_url + "@evil.example",
        public_url + "/../evil",
        public_url.replace("https://", "http://"),
        "https://" + host.split(":")[0],  # same host, default port
        "https://evil.example/" + public_url,
        "null",
    ]


def test_origin_is_matched_exactly(gateway: GatewayThread, env: DevEnv, http: httpx.Client) -> None:
    assert env.config.public_url
    db = env.config.audit_path
    for origin in look_alikes(env.config.public_url):
        before = max_seq(db)
        r = http.post(env.url, content=LIST, headers=headers(env, origin=origin))
        assert r.status_code == 403, (origin, r.status_code, r.text)
        assert [(row["kind"], row["outcome"]) for row in rows_after(db, before)] == [("refusal", "origin_refused")]
    for same in (env.config.public_url, env.config.public_url + "/", env.config.public_url.upper()):
        ok = http.post(env.url, content=LIST, headers=headers(env, origin=same))
        assert ok.status_code == 200, (same, ok.text)


def padded(size: int) -> bytes:
    """A valid tools/list request of exactly `size` bytes (JSON whitespace as padding)."""
    body = LIST[:-1] + b" " * (size - len(LIST)) + b"}"
    assert len(body) == size
    return body


@pytest.mark.parametrize("streamed", [False, True], ids=["content-length", "chunked"])
def test_body_cap_at_its_exact_boundary(gateway: GatewayThread, env: DevEnv, streamed: bool) -> None:
    limit = env.config.max_body_bytes
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    with httpx.Client(verify=ctx, timeout=60) as http:

        def send(raw: bytes) -> httpx.Response:
            if streamed:  # no Content-Length: the cap must count the streamed bytes
                chunks = (raw[i : i + 65536] for i in range(0, len(raw), 65536))
                return http.post(env.url, content=chunks, headers=headers(env))
            return http.post(env.url, content=raw, headers=headers(env))

        at_limit = send(padded(limit))
        assert at_limit.status_code == 200 and "tools" in at_limit.json()["result"], at_limit.text[:300]
        over = send(padded(limit + 1))
        assert over.status_code == 413, over.text[:300]
        assert over.json()["error"]["code"] == -32600


# --- bodies cut short or stalled (found in review: a cut body ran, a stalled one held its slot) ---------


def tls_socket(env: DevEnv) -> ssl.SSLSocket:
    url = urlsplit(env.url)
    assert url.hostname and url.port
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    return ctx.wrap_socket(socket.create_connection((url.hostname, url.port), timeout=30), server_hostname=url.hostname)


def request_head(env: DevEnv, token: str | None, framing: str) -> bytes:
    lines = [
        "POST /mcp HTTP/1.1",
        f"Host: {urlsplit(env.url).netloc}",
        "Content-Type: application/json",
        "Accept: application/json",
        "MCP-Protocol-Version: 2025-06-18",
        framing,
    ]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def wait_for_rows(db: Path, after: int, outcome: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["outcome"] == outcome for r in rows_after(db, after)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no {outcome} refusal recorded: {rows_after(db, after)}")


def read_to_close(s: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_cut_short_is_never_dispatched(gateway: GatewayThread, env: DevEnv, framing: str) -> None:
    """A whole tools/call, but the connection closes before the declared end: nothing may run."""
    sub = f"guard-cut-{framing}"
    call = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": "list_nodes", "arguments": {}}}).encode()  # fmt: skip
    if framing == "content-length":
        head, body = request_head(env, env.token(sub, ["operator"]), f"Content-Length: {len(call) + 100}"), call
    else:  # one chunk holding the whole message, and no last chunk
        head = request_head(env, env.token(sub, ["operator"]), "Transfer-Encoding: chunked")
        body = f"{len(call):x}\r\n".encode() + call + b"\r\n"
    db = env.config.audit_path
    before = max_seq(db)
    with tls_socket(env) as s:
        s.sendall(head + body)
        time.sleep(0.3)  # the body is in before the close: only the missing end tells it apart
    wait_for_rows(db, before, "body_incomplete")
    time.sleep(0.5)  # a call that did run would have left its rows by now
    rows = rows_after(db, before)
    assert [(r["kind"], r["outcome"]) for r in rows] == [("refusal", "body_incomplete")], rows
    assert not [r for r in audit_rows(db) if r["principal"] == sub]


def test_a_stalled_upload_is_408_and_frees_its_slot(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many stalled uploads as an address has request slots: a quarter of them (its upload
    slots) are refused with 408 at the body deadline, the rest with 429 and Retry-After once they
    are slow; a request sent whole from the same address is served meanwhile (before, every slot
    was the uploads' and the address was locked out until they timed out)."""
    monkeypatch.setattr(TransportGuard, "body_deadline", 3.0)
    monkeypatch.setattr(TransportGuard, "slow_body_after", 0.3)
    db = env.config.audit_path
    before = max_seq(db)
    slots = env.config.max_inflight_per_client
    uploads = max(1, slots // 4)
    stalled = [tls_socket(env) for _ in range(slots)]
    try:
        for s in stalled:
            s.sendall(request_head(env, None, "Content-Length: 1000") + b"{")
        time.sleep(1.0)  # past slow_body_after: each holds an upload slot or was refused
        served = http.post(env.url, content=LIST, headers=headers(env))
        assert served.status_code == 200 and "tools" in served.json()["result"], served.text[:300]
        answers = [read_to_close(s).decode("latin-1") for s in stalled]
        timed_out = [a for a in answers if a.startswith("HTTP/1.1 408 ")]
        refused = [a for a in answers if a.startswith("HTTP/1.1 429 ")]
        assert len(timed_out) == uploads and len(refused) == slots - uploads, [a[:40] for a in answers]
        for answer in timed_out:
            assert "connection: close" in answer.lower() and "within 3 seconds" in answer, answer
        for answer in refused:
            head = answer.lower()
            assert "connection: close" in head and "retry-after: " in head, answer
            assert "too many slow uploads from this client" in answer, answer
        served = http.post(env.url, content=LIST, headers=headers(env))
        assert served.status_code == 200 and "tools" in served.json()["result"], served.text[:300]
    finally:
        for s in stalled:
            s.close()
    outcomes = [r["outcome"] for r in rows_after(db, before) if r["kind"] == "refusal"]
    assert "body_timeout" in outcomes and "too_many_requests" in outcomes, outcomes


async def _receive_from(messages: list[Message]) -> Receive:
    async def receive() -> Message:
        return messages.pop(0)

    return receive


async def test_fewer_bytes_than_content_length_are_refused() -> None:
    """What a server that ends the body early would hand on (uvicorn disconnects instead): refused too."""
    receive = await _receive_from([{"type": "http.request", "body": b'{"a":1}', "more_body": False}])
    with pytest.raises(BodyRefused) as refused:
        await _read_capped(receive, {"content-length": "9"}, 1024, 5.0)
    assert (refused.value.status, refused.value.outcome) == (400, "body_incomplete")
    whole = await _receive_from([{"type": "http.request", "body": b'{"a":1}', "more_body": False}])
    assert await _read_capped(whole, {"content-length": "7"}, 1024, 5.0) == b'{"a":1}'
