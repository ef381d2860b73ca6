"""The SSH path's two limits on a node, against the simulator's sshd model.

Sessions: every call to a node shares one pooled connection, and sshd refuses a session
beyond its MaxSessions (OpenSSH's default: 10) with "open failed". Before, the runtime
opened one per command with no bound: the 11th concurrent command to a node failed with
ChannelOpenError. Now at most `ssh.max_sessions` run at once; the rest wait for a free
session within their own timeout, and a waiter that gives up frees nothing.

Timeout: sshd does not end a command whose channel the client closed, so a command that
timed out (a df hung on a dead NFS mount) kept running on the node, and holding its
session, one more per retry. Now every command runs under `timeout -k 2 <seconds>`; the
node stops it and says so (124), which the call reports as a timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import asyncssh
import pytest

from gateway.dev.devenv import DevEnv
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.sim import shell
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, CommandFailed, ToolError
from gateway.tools.runtimes.pve_api import PveApiClient
from gateway.tools.runtimes.ssh import AllowList, SshRuntime
from gateway.tools.targets import TargetResolver
from gateway.tools.tool import Tool

MARGIN = 1.0  # scheduling slack on a busy 2-core machine
DF = "^df "  # the ssh_hang fault: df blocks as on a dead NFS mount
CATALOG = Catalog.load(REPO_ROOT / "connectors")


def tool(name: str) -> Tool:
    return CATALOG.tools[name]


@pytest.fixture
def faults(sim: Any) -> Iterator[Any]:
    """The shared simulator, its SSH faults lifted afterwards and no command left running."""
    sim.clear_logs()
    try:
        yield sim
    finally:
        sim.set_faults(ssh_latency_ms=0, ssh_hang=None)
        for _ in range(100):  # a lifted hang ends its commands within the simulator's poll (50 ms)
            if not sim.ssh_running():
                break
            time.sleep(0.05)
        assert sim.ssh_running() == []


def runtime(env: DevEnv, **ssh_changes: Any) -> SshRuntime:
    cl = env.config.clusters["default"]
    assert cl.ssh is not None
    cl = dataclasses.replace(cl, ssh=dataclasses.replace(cl.ssh, **ssh_changes))
    return SshRuntime({"default": cl}, TargetResolver({"default": PveApiClient(cl)}), AllowList(CATALOG))


def peak(entries: list[dict[str, Any]]) -> int:
    """Most commands running at once on the node, from the simulator's log (start, end)."""
    edges = sorted([(e["time"], 1) for e in entries] + [(e["ended"], -1) for e in entries])
    live = top = 0
    for _, step in edges:
        live += step
        top = max(top, live)
    return top


async def outcome(rt: SshRuntime, name: str, args: dict[str, Any]) -> str:
    try:
        await rt.call(tool(name), args, CallContext("default"))
        return "ok"
    except ToolError as exc:
        return str(exc)


# --- sessions -------------------------------------------------------------------------------------------


async def test_simulator_refuses_the_eleventh_session_like_sshd(faults: Any) -> None:
    sim = faults
    n = sim.ssh_nodes["pve1"]
    sim.set_faults(ssh_hang="^qm list$")  # ten commands that do not end
    known = asyncssh.import_known_hosts(f"[{n.ssh_host}]:{n.ssh_port} {n.host_key}\n")
    async with asyncssh.connect(
        n.ssh_host, n.ssh_port, username=sim.ssh_user, client_keys=[str(sim.ssh_client_key)], known_hosts=known
    ) as conn:
        procs = [await conn.create_process("qm list") for _ in range(10)]
        with pytest.raises(asyncssh.ChannelOpenError, match="open failed"):
            await conn.create_process("qm list")
        procs[0].close()  # the client gives up on one: sshd neither ends its command nor frees the session
        await procs[0].wait_closed()
        with pytest.raises(asyncssh.ChannelOpenError):
            await conn.create_process("pct list")
        assert len(sim.ssh_running()) == 10
        sim.set_faults(ssh_hang=None)  # the commands end: their sessions are free again
        for p in procs[1:]:
            await p.wait()
        r = await conn.run("pct list", check=False)
        assert r.exit_status == 0 and "VMID" in str(r.stdout)


async def test_twenty_concurrent_calls_to_one_node_all_succeed(env: DevEnv, faults: Any) -> None:
    sim = faults
    rt = runtime(env)  # ssh.max_sessions: the default, 10
    sim.set_faults(ssh_latency_ms=300)  # the commands overlap
    try:
        results = await asyncio.gather(*(outcome(rt, "node_filesystems", {"node": "pve1"}) for _ in range(20)))
        assert results == ["ok"] * 20, {r for r in results if r != "ok"}
        assert len(rt.pool._conns) == 1  # still one connection
    finally:
        await rt.close()
    runs = [e for e in sim.ssh_log() if e["argv"] and e["argv"][0] == "df"]
    assert len(runs) == 20 and 1 < peak(runs) <= 10, peak(runs)


async def test_a_session_the_node_refuses_is_asked_for_again_until_the_deadline(env: DevEnv, faults: Any) -> None:
    sim = faults
    # more than the node's sshd allows: the refused sessions are asked for again (nothing ran) and get one
    # as the others end (sshd also frees a session only a moment after its channel closed: the same retry)
    rt = runtime(env, max_sessions=20)
    sim.set_faults(ssh_latency_ms=300)
    try:
        results = await asyncio.gather(*(outcome(rt, "node_filesystems", {"node": "pve1"}) for _ in range(20)))
        assert results == ["ok"] * 20, {r for r in results if r != "ok"}
    finally:
        await rt.close()
    runs = [e for e in sim.ssh_log() if e["argv"] and e["argv"][0] == "df"]
    assert len(runs) == 20 and peak(runs) <= 10  # each ran once; never more than the node allows

    # while ten hung commands hold the node's sessions, the other ten are refused until their deadline
    sim.clear_logs()
    sim.set_faults(ssh_latency_ms=0, ssh_hang=DF)
    rt = runtime(env, max_sessions=20, command_timeout=1.0)
    try:
        results = await asyncio.gather(*(outcome(rt, "node_filesystems", {"node": "pve1"}) for _ in range(20)))
    finally:
        await rt.close()
    assert sorted(set(results)) == [
        "command on node pve1 timed out after 1s and was stopped on the node",
        "node pve1 refused a new SSH session (open failed) for 1s: is ssh.max_sessions (20) above the node's sshd "
        "MaxSessions?",
    ], results
    assert results.count("command on node pve1 timed out after 1s and was stopped on the node") == 10
    assert len(sim.ssh_log()) == 10


async def test_waiting_for_a_session_counts_against_the_timeout_and_frees_nothing_it_did_not_take(
    env: DevEnv, faults: Any
) -> None:
    sim = faults
    sim.set_faults(ssh_hang=DF)
    rt = runtime(env, max_sessions=1, command_timeout=1.0)
    loop = asyncio.get_running_loop()
    dispatched = asyncio.Event()

    async def on_dispatch(_: dict[str, Any]) -> None:
        dispatched.set()

    try:
        # a hung df, abandoned by its caller: the node may still run it, so its session stays taken until
        # the node's `timeout` has surely ended it
        hung = asyncio.create_task(
            rt.call(tool("node_filesystems"), {"node": "pve1"}, CallContext("default", on_dispatch=on_dispatch))
        )
        await asyncio.wait_for(dispatched.wait(), 5)
        hung.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hung

        waiter = asyncio.create_task(outcome(rt, "node_qm_list", {"node": "pve1"}))  # gives up while waiting
        await asyncio.sleep(0.2)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

        started = loop.time()
        result = await outcome(rt, "node_qm_list", {"node": "pve1"})
        took = loop.time() - started
        assert result == (
            "command on node pve1 not started: all 1 SSH sessions to the node stayed busy for 1s (ssh.max_sessions)"
        )
        assert 1.0 <= took <= 1.0 + MARGIN, took  # its own timeout, not the hung command's
        assert not [e for e in sim.ssh_log() if e["argv"] == ["qm", "list"]]  # nothing was sent for them

        await asyncio.sleep(0.5)
        assert sim.ssh_running() == []  # the abandoned df: stopped by the node at its 1 s
        slots = rt.pool.slots("default", "pve1", rt.pool._conns[("default", "pve1")], 1)
        for _ in range(100):  # freed once the node has surely ended it (1 s + KILL 2 s + 1 s)
            if not slots.locked():
                break
            await asyncio.sleep(0.05)
        assert slots._value == 1  # exactly the one slot: the cancelled and timed-out waiters freed nothing
        assert await outcome(rt, "node_qm_list", {"node": "pve1"}) == "ok"
        assert slots._value == 1
    finally:
        await rt.close()


# --- timeout on the node --------------------------------------------------------------------------------


async def test_a_timed_out_command_is_stopped_on_the_node(env: DevEnv, faults: Any) -> None:
    sim = faults
    sim.set_faults(ssh_hang=DF)
    rt = runtime(env, command_timeout=1.0)
    records: list[dict[str, Any]] = []

    async def on_dispatch(info: dict[str, Any]) -> None:
        records.append(info)

    loop = asyncio.get_running_loop()
    try:
        for _ in range(3):  # a caller retrying: no pile of hung commands on the node
            started = loop.time()
            with pytest.raises(CommandFailed) as err:
                await rt.call(
                    tool("node_filesystems"), {"node": "pve1"}, CallContext("default", on_dispatch=on_dispatch)
                )
            assert loop.time() - started <= 1.0 + MARGIN
            assert str(err.value) == "command on node pve1 timed out after 1s and was stopped on the node"
            assert err.value.exit_status == 124
            assert sim.ssh_running() == []
        sim.set_faults(ssh_hang=None)
        out = await rt.call(tool("node_filesystems"), {"node": "pve1"}, CallContext("default"))
        assert {f["mountpoint"] for f in out.data} >= {"/", "/boot/efi"}
    finally:
        await rt.close()
    runs = sim.ssh_log()
    assert [(e["exit_status"], e["signal"], e["timeout"]) for e in runs] == [(124, "TERM", 1.0)] * 3 + [(0, None, 1.0)]
    assert runs[0]["command"].startswith("timeout -k 2 1 df ") and runs[0]["argv"][0] == "df"
    declared = tool("node_filesystems").spec["argv"]
    assert records == [{"node": "pve1", "argv": declared, "wrapper": ["timeout", "-k", "2", "1"]}] * 3


def test_node_timeout_prefix() -> None:
    from gateway.tools.runtimes.ssh import node_timeout

    assert node_timeout(10.0) == ["timeout", "-k", "2", "10"]
    assert node_timeout(9.99) == ["timeout", "-k", "2", "10"]
    assert node_timeout(1.5) == ["timeout", "-k", "2", "1.5"]
    assert node_timeout(6.71) == ["timeout", "-k", "2", "6.8"]  # rounded up to a tenth
    assert node_timeout(0.0001) == ["timeout", "-k", "2", "0.1"]  # never 0, which is no limit
    assert node_timeout(-1) == ["timeout", "-k", "2", "0.1"]
    assert node_timeout(1e7) == ["timeout", "-k", "2", "10000000"]  # no exponent


def test_simulator_reads_timeout_like_coreutils() -> None:
    limit, argv = shell.split_timeout(["timeout", "-k", "2", "1.5", "df", "-B1"])  # type: ignore[misc]
    assert limit == shell.Timeout(1.5, 2.0, "TERM", False) and argv == ["df", "-B1"]
    limit, argv = shell.split_timeout(["timeout", "--kill-after=1m", "-sKILL", "--preserve-status", "2s", "qm", "list"])  # type: ignore[misc]
    assert limit == shell.Timeout(2.0, 60.0, "KILL", True) and argv == ["qm", "list"]
    assert shell.split_timeout(["qm", "list"]) == (None, ["qm", "list"])
    assert shell.split_timeout(["timeout", "-k", "2", "10", "--", "-x"]) == (
        shell.Timeout(10.0, 2.0, "TERM", False),
        ["--", "-x"],
    )
    for bad in (
        ["timeout"],
        ["timeout", "10"],
        ["timeout", "ten", "df"],
        ["timeout", "-k"],
        ["timeout", "-z", "1", "df"],
    ):
        res = shell.split_timeout(bad)
        assert isinstance(res, shell.Result) and res.exit_status == 125, bad


async def test_a_waiter_whose_connection_closed_is_told_so_at_once(env: DevEnv, faults: Any) -> None:
    """A call that got its session slot only after the pooled connection went (sshd restarted, the
    node rebooted) failed after its whole timeout blaming max_sessions; now it says the connection
    was lost, at once, and the next call connects afresh."""
    rt = runtime(env, max_sessions=1, command_timeout=5.0)
    try:
        conn, _ = await rt.pool.get("default", "pve1")
        slots = rt.pool.slots("default", "pve1", conn, 1)
        await slots.acquire()  # a command that just finished on this connection
        waiting = asyncio.create_task(outcome(rt, "node_pct_list", {"node": "pve1"}))
        await asyncio.sleep(0.3)
        conn.close()
        await conn.wait_closed()
        started = time.monotonic()
        slots.release()
        said = await waiting
        assert said == "SSH connection to node pve1 was lost before the command started; nothing ran", said
        assert time.monotonic() - started < 2 + MARGIN
        assert await outcome(rt, "node_pct_list", {"node": "pve1"}) == "ok"
    finally:
        await rt.close()
