"""A session the runtime gave up opening is closed once the node opens it, not left open for ever.

When the node's confirmation of a channel open came late (a network stall, a node under load) the
call timed out, or was cancelled (a composite's deadline, a drain), while asyncssh still waited for
it. asyncssh then opened the channel on the confirmation's arrival and nobody ever closed it: an
open session with no command, which sshd counts against MaxSessions until the connection ends. The
pooled connection lives for ever (keepalives), so after `max_sessions` such stalls every later call
to the node, from every client, failed with "node pve1 refused a new SSH session" until the gateway
restarted. Now an abandoned open is closed when it completes, before any command is sent on it.

Against the simulator's sshd model (it refuses the 11th session, as OpenSSH does), through a TCP
proxy that holds the node's answers back for a while.
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
from gateway.sim.ssh import MAX_SESSIONS
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, ToolError
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.runtimes.ssh import AllowList, SshRuntime
from gateway.tools.targets import TargetResolver

CATALOG = Catalog.load(REPO_ROOT / "connectors")
QM_LIST = CATALOG.tools["node_qm_list"]


class StallingProxy:
    """TCP between the runtime and the node; while `stall` is set, what the node sends is delivered
    `stall` seconds late (in order), as over a congested link."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.stall = 0.0
        self.port = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, stalled: bool) -> None:
        loop = asyncio.get_running_loop()
        line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:  # each chunk at its own time, in order
            while True:
                due, data = await line.get()
                await asyncio.sleep(max(0.0, due - loop.time()))
                dst.write(data)
                await dst.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while data := await src.read(65536):
                line.put_nowait((loop.time() + (self.stall if stalled else 0.0), data))
        except OSError:
            pass
        finally:
            delivering.cancel()
            await asyncio.gather(delivering, return_exceptions=True)
            dst.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        node_r, node_w = await asyncio.open_connection(*self.target)
        self._writers += [client_w, node_w]
        for task in (self._pipe(client_r, node_w, False), self._pipe(node_r, client_w, True)):
            t = asyncio.ensure_future(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._server.close()
        for w in self._writers:
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


@pytest.fixture
async def proxied(env: DevEnv, sim: Any) -> AsyncIterator[tuple[SshRuntime, StallingProxy]]:
    sim.clear_logs()
    n = sim.ssh_nodes["pve1"]
    proxy = StallingProxy(n.ssh_host, n.ssh_port)
    await proxy.start()
    cl = env.config.clusters["default"]
    assert cl.ssh is not None
    node = SSHNodeConfig("pve1", "127.0.0.1", proxy.port, cl.ssh.nodes["pve1"].host_key)
    cl = dataclasses.replace(cl, ssh=dataclasses.replace(cl.ssh, nodes={"pve1": node}, command_timeout=1.0))
    rt = SshRuntime({"default": cl}, TargetResolver({"default": PveApiClient(cl)}), AllowList(CATALOG))
    try:
        yield rt, proxy
    finally:
        await rt.close()
        await proxy.close()


async def test_opens_given_up_on_do_not_use_up_the_nodes_sessions(
    proxied: tuple[SshRuntime, StallingProxy], sim: Any
) -> None:
    rt, proxy = proxied
    await rt.call(QM_LIST, {"node": "pve1"}, CallContext("default"))  # the pooled connection, made unstalled
    proxy.stall = 0.5
    for _ in range(MAX_SESSIONS):  # each gives up while the node's "channel open" answer is held back
        call = asyncio.ensure_future(rt.call(QM_LIST, {"node": "pve1"}, CallContext("default")))
        await asyncio.sleep(0.1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    proxy.stall = 0.0
    # the held-back answers arrive (the sessions open, and are closed again), and the runtime's own
    # count frees each abandoned session when its command would surely have ended (1 s + 2 s + 1 s)
    await asyncio.sleep(4.5)

    try:  # before: "node pve1 refused a new SSH session (open failed) for 1s: ..." here, and for ever after
        out = await rt.call(QM_LIST, {"node": "pve1"}, CallContext("default"))
    except ToolError as exc:
        pytest.fail(f"a later call failed: {exc}")
    assert isinstance(out.data, list) and out.data
    ran = [e for e in sim.ssh_log() if e["argv"] == ["qm", "list"]]
    assert len(ran) == 2, ran  # the first and the last call's: no command on a session given up on


async def test_an_open_that_timed_out_is_closed_when_it_completes(
    proxied: tuple[SshRuntime, StallingProxy], sim: Any
) -> None:
    rt, proxy = proxied
    await rt.call(QM_LIST, {"node": "pve1"}, CallContext("default"))
    proxy.stall = 4.5  # past the call's bound on an open: 1 s timeout + 2 s KILL grace + 1 s verdict grace
    results = await asyncio.gather(
        *(rt.call(QM_LIST, {"node": "pve1"}, CallContext("default")) for _ in range(MAX_SESSIONS)),
        return_exceptions=True,
    )
    assert all(isinstance(r, ToolError) and "timed out" in str(r) for r in results), results
    proxy.stall = 0.0
    await asyncio.sleep(1.5)  # the held-back "open" answers arrive; the slots were freed at the calls' end
    try:
        out = await rt.call(QM_LIST, {"node": "pve1"}, CallContext("default"))
    except ToolError as exc:
        pytest.fail(f"a later call failed: {exc}")
    assert isinstance(out.data, list) and out.data
    ran = [e for e in sim.ssh_log() if e["argv"] == ["qm", "list"]]
    assert len(ran) == 2, ran
