"""Wire edges found in review (gateway/mcp/transport.py, gateway/mcp/security.py), on the live gateway."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.support import GatewayThread


@pytest.fixture(scope="module")
def http(env: DevEnv) -> Iterator[httpx.Client]:
    with httpx.Client(verify=ssl.create_default_context(cafile=str(env.ca_file)), timeout=30) as client:
        yield client


def legacy_headers(env: DevEnv, **extra: str) -> dict[str, str]:
    h = {
        "authorization": f"Bearer {env.token('s46-agent', ['operator'])}",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2025-11-25",
    }
    h.update(extra)
    return h


# ---- a notification the server cannot accept -----------------------------------------------------
# Streamable HTTP (2025-03-26 to 2025-11-25): a notification accepted is 202; one the server cannot
# accept MUST get an HTTP error status. It got 200 with a JSON-RPC error, which a client reads as a
# response (to no request of its: it has no id).

BAD_NOTIFICATIONS = [
    ("params_array", b'{"jsonrpc":"2.0","method":"notifications/initialized","params":[1]}', -32602),
    ("params_string", b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}', -32602),
    (
        "lone_surrogate",
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"\\ud800"}}',
        -32602,
    ),
]


@pytest.mark.parametrize(("body", "code"), [c[1:] for c in BAD_NOTIFICATIONS], ids=[c[0] for c in BAD_NOTIFICATIONS])
@pytest.mark.parametrize("version", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_a_notification_that_cannot_be_accepted_gets_an_http_error(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client, version: str, body: bytes, code: int
) -> None:
    before = max_seq(env.config.audit_path)
    r = http.post(env.url, content=body, headers=legacy_headers(env, **{"mcp-protocol-version": version}))
    assert r.status_code == 400, (r.status_code, r.text)
    doc = r.json()
    assert doc["id"] is None and doc["error"]["code"] == code and "Traceback" not in r.text
    assert [row["outcome"] for row in rows_after(env.config.audit_path, before)] == ["protocol_error"]


def test_requests_keep_their_200_and_good_notifications_their_202(
    gateway: GatewayThread, env: DevEnv, http: httpx.Client
) -> None:
    """A request with an id keeps the handshake era's 200 for a params fault; a notification accepted, 202."""
    r = http.post(
        env.url, content=b'{"jsonrpc":"2.0","id":7,"method":"tools/list","params":[1]}', headers=legacy_headers(env)
    )
    assert r.status_code == 200 and r.json()["id"] == 7 and r.json()["error"]["code"] == -32602
    n = http.post(
        env.url,
        content=b'{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}',
        headers=legacy_headers(env),
    )
    assert n.status_code == 202 and n.content == b""


# ---- an Origin sent twice --------------------------------------------------------------------------
# The guard read the last copy of a header sent twice (Starlette, and every handler, the first): a
# foreign Origin followed by our own passed the Origin check.


def raw_post(env: DevEnv, lines: list[tuple[str, str]], body: bytes) -> tuple[int, bytes]:
    """One request with exactly these header lines (httpx folds repeated ones)."""
    url = urlsplit(env.url)
    assert url.hostname and url.port
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    head = f"POST {url.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines)
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    with (
        socket.create_connection((url.hostname, url.port), timeout=30) as plain,
        ctx.wrap_socket(plain, server_hostname=url.hostname) as s,
    ):
        s.sendall(head.encode("latin-1") + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("own_first", [False, True])
def test_an_origin_sent_twice_is_refused(gateway: GatewayThread, env: DevEnv, own_first: bool) -> None:
    assert env.config.public_url
    host = urlsplit(env.url).netloc
    origins = ["https://evil.example", env.config.public_url]
    if own_first:
        origins.reverse()
    lines = [("Host", host), *legacy_headers(env).items(), *(("Origin", o) for o in origins)]
    before = max_seq(env.config.audit_path)
    status, body = raw_post(env, lines, b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert status == 403, body
    assert json.loads(body)["error"]["code"] == -32600
    assert [row["outcome"] for row in rows_after(env.config.audit_path, before)] == ["origin_refused"]


def test_one_own_origin_still_passes(gateway: GatewayThread, env: DevEnv) -> None:
    assert env.config.public_url
    lines = [("Host", urlsplit(env.url).netloc), *legacy_headers(env).items(), ("Origin", env.config.public_url)]
    status, body = raw_post(env, lines, b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert status == 200 and json.loads(body)["result"] == {}


# ---- an Authorization header sent twice --------------------------------------------------------------
# RFC 6750 §2: one token per request. The first copy was verified, and a second one, that an intermediary
# reading the last copy would act on, went unseen: the request ran as the first token's principal.


@pytest.mark.parametrize("valid_first", [True, False])
def test_an_authorization_header_sent_twice_is_refused(gateway: GatewayThread, env: DevEnv, valid_first: bool) -> None:
    tokens = [env.token("s46-agent", ["operator"]), env.token("s46-other", ["viewer"])]
    if not valid_first:
        tokens[0] = "not-a-token"
    rest = [(k, v) for k, v in legacy_headers(env).items() if k != "authorization"]
    lines = [("Host", urlsplit(env.url).netloc), *rest, *(("Authorization", f"Bearer {t}") for t in tokens)]
    before = max_seq(env.config.audit_path)
    status, body = raw_post(env, lines, b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
    assert status == 401, body
    assert json.loads(body) == {
        "error": "invalid_request",
        "error_description": "the Authorization header appears more than once",
    }
    rows = rows_after(env.config.audit_path, before)
    assert [(r["kind"], r["outcome"]) for r in rows] == [("auth_failure", "invalid_request")]
    assert not any(t.split(".")[-1] in json.dumps(rows) for t in tokens if "." in t)  # no credential recorded
