"""How an OPA address becomes a client: `unix://` for the managed sidecar's socket, URLs otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import pytest

from gateway.policy.decisions import DecisionClient
from gateway.policy.opa_address import (
    aiohttp_connector,
    http_base,
    httpx_async_client,
    httpx_client,
    socket_path,
    unix_address,
)
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar


def test_addresses() -> None:
    assert socket_path(unix_address("/run/x/opa.sock")) == "/run/x/opa.sock"
    assert socket_path("http://127.0.0.1:8181") is None
    assert http_base("http://opa:8181/") == "http://opa:8181"
    assert http_base("unix:///run/x/opa.sock") == "http://localhost"


def test_tcp_addresses_keep_the_clients_defaults() -> None:
    async def connector() -> aiohttp.BaseConnector | None:
        return aiohttp_connector("https://opa.example:8181")

    assert asyncio.run(connector()) is None
    with httpx_client("http://127.0.0.1:1") as c:
        assert str(c.base_url) == "http://127.0.0.1:1"


@pytest.fixture(scope="module")
def sidecar() -> Iterator[OPASidecar]:
    s = OPASidecar(policies=(REPO_ROOT / "policies",), decision_logs=False)
    s.start()
    yield s
    s.stop()


def test_every_client_reaches_the_socket(sidecar: OPASidecar) -> None:
    """httpx (sync and async) and the decision client all speak HTTP over the socket."""
    with httpx_client(sidecar.url, timeout=5) as c:
        assert c.get("/health").status_code == 200

    async def both() -> tuple[int, bool]:
        async with httpx_async_client(sidecar.url, timeout=5) as c:
            status = (await c.get("/v1/data/pvegate/data_check")).status_code
        client = DecisionClient(sidecar.url, 5000)
        try:
            decision = await client.decide({"contract_version": 1, "kind": "call"})
        finally:
            await client.close()
        return status, decision.allow

    assert asyncio.run(both()) == (200, False)


def test_a_socket_that_is_gone_fails_closed(tmp_path: Path) -> None:
    client = DecisionClient(unix_address(str(tmp_path / "absent.sock")), 2000)

    async def ask() -> tuple[bool, bool, str]:
        try:
            d = await client.decide({"contract_version": 1, "kind": "call"})
        finally:
            await client.close()
        return d.allow, d.failed_closed, " ".join(d.deny)

    with pytest.raises(httpx.ConnectError):
        with httpx_client(unix_address(str(tmp_path / "absent.sock")), timeout=2) as c:
            c.get("/health")
    allow, failed_closed, why = asyncio.run(ask())
    assert not allow and failed_closed and "OPA unreachable" in why, why


def _server_side_connections(socket: Path) -> set[str]:
    """Inodes of the connected sockets OPA accepted on its socket (/proc/net/unix names its path)."""
    rows = (line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:])
    return {r[6] for r in rows if len(r) >= 8 and r[7] == str(socket) and r[5] == "03"}


def test_the_decision_client_keeps_its_connection(sidecar: OPASidecar) -> None:
    """Every decision over the same kept-alive connection, never a connection per call: OPA serves
    a connection from one goroutine, whose stack has grown to what an evaluation needs (~256 KB);
    a new one grows it again, which costs OPA 0.3 to 0.5 ms of evaluation per decision (+40 % of its
    CPU; docs/performance.md, "Where OPA's server spends what opa bench does not")."""

    async def ask() -> tuple[set[str], set[str], set[str]]:
        client = DecisionClient(sidecar.url, 5000)
        before = _server_side_connections(sidecar.socket_path)
        try:
            await client.decide({"contract_version": 1, "kind": "call"})
            first = _server_side_connections(sidecar.socket_path) - before
            for _ in range(20):
                await client.decide({"contract_version": 1, "kind": "call"})
            later = _server_side_connections(sidecar.socket_path) - before
        finally:
            await client.close()
        await asyncio.sleep(0.2)
        return first, later, _server_side_connections(sidecar.socket_path) - before

    first, later, closed = asyncio.run(ask())
    assert len(first) == 1, first
    assert later == first, "the decision client opened another connection to OPA"
    assert not closed, "closing the client leaves its connection open"
