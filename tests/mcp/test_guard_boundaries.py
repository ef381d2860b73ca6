"""Transport guards at their exact edges (gateway/security.py), through the live gateway.

Planted in review and not caught before: an Origin check by prefix (so
`<public_url>.evil.example` passed), and a body cap off by one.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.support import GatewayThread

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
