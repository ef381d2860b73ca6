"""A node whose SSH port accepts and never speaks costs each call at most its own timeout.

Before: the per-node connect lock was held across the handshake, so four concurrent
calls to such a node failed at 1x, 2x, 3x and 4x the timeout. The bound below is
not a performance figure: timeout + 1 s is far below 2x the timeout, the first
serialised finish.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.core.config import SSHNodeConfig
from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, ToolError
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.runtimes.ssh import AllowList, SshRuntime
from gateway.tools.targets import TargetResolver

TIMEOUT = 1.5
MARGIN = 1.0  # scheduling slack on a busy 2-core machine; serialisation would add a whole TIMEOUT


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(REPO_ROOT / "connectors")


@pytest.fixture
async def silent_port() -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP listener on loopback that accepts and never sends a byte (an SSH daemon hung before its banner)."""
    held: list[asyncio.StreamWriter] = []
    accepted: list[int] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        accepted.append(1)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, accepted
    finally:
        server.close()
        for w in held:
            w.close()
        await server.wait_closed()


def runtime(env: DevEnv, catalog: Catalog, hung_port: int) -> SshRuntime:
    cl = env.config.clusters["default"]
    assert cl.ssh is not None
    hung = SSHNodeConfig("hung", "127.0.0.1", hung_port, cl.ssh.nodes["pve1"].host_key)
    ssh = dataclasses.replace(cl.ssh, nodes={**cl.ssh.nodes, "hung": hung}, command_timeout=TIMEOUT)
    cl = dataclasses.replace(cl, ssh=ssh)
    client = PveApiClient(cl)
    return SshRuntime({"default": cl}, TargetResolver({"default": client}), AllowList(catalog))


async def test_hung_node_costs_each_call_its_own_timeout(
    env: DevEnv, sim: Any, catalog: Catalog, silent_port: tuple[int, list[int]]
) -> None:
    port, accepted = silent_port
    rt = runtime(env, catalog, port)
    tool = catalog.tools["node_qm_list"]
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def timed(node: str, delay: float = 0.0) -> tuple[str, float, float]:
        await asyncio.sleep(delay)
        started = loop.time()
        try:
            await rt.call(tool, {"node": node}, CallContext("default"))
            outcome = "ok"
        except ToolError as exc:
            outcome = str(exc)
        return outcome, started - t0, loop.time() - started

    try:
        sim.clear_logs()
        results = await asyncio.gather(*(timed("hung") for _ in range(4)), timed("pve1", delay=0.2))
        hung, healthy = results[:4], results[4]
        for outcome, _, took in hung:
            assert "SSH to node hung failed (TimeoutError)" in outcome, outcome
            assert took <= TIMEOUT + MARGIN, [round(h[2], 2) for h in hung]
        assert healthy[0] == "ok", healthy  # another node, during the hang: unaffected
        assert healthy[1] + healthy[2] < max(h[2] for h in hung), (healthy, hung)  # done while they still waited
        assert accepted == [1], "concurrent callers share one connection attempt per node"
        assert "qm list" in str(sim.ssh_log())

        # the failure is not cached: the next call makes a fresh attempt, and again only costs its timeout
        await asyncio.sleep(0.3)  # the shared attempt ends on its own timer, a moment after its callers gave up
        outcome, _, took = await timed("hung")
        assert "TimeoutError" in outcome and took <= TIMEOUT + MARGIN and len(accepted) == 2
    finally:
        await rt.close()
