"""An SSH call that never got a session on the node is an `upstream_error`, its quota slot given back.

Before: after a connection never made became `upstream_error` (test_s51_ssh_connect_unsent.py), four
more failures that provably sent no command were still audited `failed` and spent the caller's quota
slot (and an approval): every SSH session to the node stayed busy until the call's timeout (the SSH
side of the API's `busy`); the pooled connection closed while the call waited for a session; the node
refused every new session until the deadline; and the node (or the cluster) has no SSH access in the
gateway's configuration, a gap in the configuration rather than in the call. In none of them was a
session ever opened, and a command is only sent on an open session. A session the node opened is
different: asyncssh sends the exec request at once, and a refusal of it (ChannelOpenError "Session
request failed") may follow a command that ran: it stays `failed`, and is not asked again (the old
code took it for a refused open and sent the command again until the deadline).

Real gateway, real managed OPA with a quota of 1 per tool, the simulator's SSH nodes (sshd's
MaxSessions of 10, commands that hang on demand); the last test a hostile node that refuses every exec.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import asyncssh
import httpx
import pytest
import yaml

from gateway.core.config import ClusterConfig, SecretRef, SSHConfig, SSHNodeConfig
from gateway.dev.devenv import DevEnv, cluster_entry, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.runtimes.base import CallContext, ToolError, UpstreamError
from gateway.tools.runtimes.ssh import AllowList, SshPool, SshRuntime
from tests.connectors.hostile_ssh import CATALOG, AnyClientKey, Locator, client_key
from tests.support import GatewayThread, audit_rows, free_port

QUOTA = {"name": "s51-one", "tools": ["node_qm_list", "node_pct_list"], "counter": "tool", "window": "1m", "limit": 1}
HOLDER = "s51-holder"  # holds sessions with node_filesystems (no quota): not the principal under test
T = TypeVar("T")


@pytest.fixture(scope="module")
def s51env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    work = tmp_path_factory.mktemp("s51s")
    policy = work / "policy"
    data = yaml.safe_load((REPO_ROOT / "policies" / "data" / "data.yaml").read_text())
    data["quotas"] = [QUOTA]
    (policy / "data").mkdir(parents=True)
    (policy / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    secrets = work / "secrets"
    busy = cluster_entry("busy", sim, secrets)  # one session per node, a 1 s timeout
    busy["ssh"].update(max_sessions=1, command_timeout=1.0)
    refused = cluster_entry("refused", sim, secrets)
    refused["ssh"].update(command_timeout=1.0)
    lost = cluster_entry("lost", sim, secrets)
    lost["ssh"].update(max_sessions=1, command_timeout=5.0)
    gap = cluster_entry("gap", sim, secrets)  # pve2 is a node of the cluster, without SSH access configured
    del gap["ssh"]["nodes"]["pve2"]
    nossh = cluster_entry("nossh", sim, secrets)
    del nossh["ssh"]
    clusters = [cluster_entry("default", sim, secrets), busy, refused, lost, gap, nossh]
    return make_env(work, {}, port=free_port(), opa=opa, extra={"clusters": clusters})


@pytest.fixture(scope="module")
def s51gw(s51env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(s51env.config).start()
    yield gw
    gw.stop()


@pytest.fixture
def faults(sim: Any) -> Iterator[Any]:
    sim.clear_logs()
    try:
        yield sim
    finally:
        sim.set_faults(ssh_hang=None)
        for _ in range(200):  # a lifted hang ends its commands within the simulator's poll
            if not sim.ssh_running():
                break
            time.sleep(0.05)


async def call(env: DevEnv, who: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(env.ca_file))
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"Authorization": f"Bearer {env.token(who, ['operator'])}", "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(verify=ctx, timeout=60.0) as http:
        r = await http.post(env.url, json=body, headers=headers)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def text(result: dict[str, Any]) -> str:
    return " ".join(c.get("text", "") for c in result["content"])


def on_gateway(gw: GatewayThread, coro: Coroutine[Any, Any, T]) -> T:
    assert gw.loop is not None
    return asyncio.run_coroutine_threadsafe(coro, gw.loop).result(timeout=30)


def pool(gw: GatewayThread) -> SshPool:
    return cast(SshRuntime, gw.components.runtimes["ssh"]).pool


def used(gw: GatewayThread, who: str, tool: str) -> int:
    async def counts() -> dict[str, dict[str, int]]:
        return gw.components.usage.counts(who, tool)  # type: ignore[attr-defined,no-any-return]

    return on_gateway(gw, counts())["tool"]["1m"]


def upstream_errors(gw: GatewayThread, cluster: str, reason: str) -> float:
    got = gw.components.metrics.registry.get_sample_value(
        "pvegate_upstream_errors_total", {"cluster": cluster, "kind": "ssh", "reason": reason}
    )
    return got or 0.0


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def assert_unsent(
    env: DevEnv, gw: GatewayThread, sim: Any, res: dict[str, Any], why: str, cluster: str, reason: str, before: float
) -> None:
    """Audited upstream_error right after the decision (no dispatch record), in the gateway's words, counted."""
    rows = audit_rows(env.config.audit_path, res["_meta"]["pvegate/request_id"])
    kinds = [(r["kind"], r["outcome"]) for r in rows]
    assert kinds == [("received", None), ("decision", "allow"), ("result", "upstream_error")], (kinds, res)
    assert res["isError"] is True and why in text(res), res
    assert why in json.loads(rows[-1]["body"])["error"]
    assert upstream_errors(gw, cluster, reason) == before + 1
    secret = Path(sim.ssh_client_key).read_text().splitlines()[1]
    assert secret not in json.dumps(res) and secret not in json.dumps([r["body"] for r in rows])


async def test_all_sessions_busy_is_an_upstream_error_and_spends_no_quota(
    s51gw: GatewayThread, s51env: DevEnv, faults: Any
) -> None:
    sim, who = faults, "s51-busy"
    warm = await call(s51env, HOLDER, "node_filesystems", {"node": "pve1", "cluster": "busy"})
    assert warm["isError"] is False, text(warm)  # the pooled connection is made
    conn = pool(s51gw)._conns[("busy", "pve1")]
    slots = pool(s51gw).slots("busy", "pve1", conn, 1)

    async def take() -> None:  # the node's one session (ssh.max_sessions: 1) held past the call's 1 s
        await slots.acquire()

    async def give() -> None:
        slots.release()

    on_gateway(s51gw, take())
    try:
        before = upstream_errors(s51gw, "busy", "busy")
        res = await call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": "busy"})
    finally:
        on_gateway(s51gw, give())
    why = "command on node pve1 not started: all 1 SSH sessions to the node stayed busy for 1s (ssh.max_sessions)"
    assert_unsent(s51env, s51gw, sim, res, why, "busy", "busy", before)
    assert used(s51gw, who, "node_qm_list") == 0
    assert not [e for e in sim.ssh_log() if e["argv"] == ["qm", "list"]]  # nothing was sent
    # the quota is live: the call the node runs spends it, the next is refused
    ok = await call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": "busy"})
    assert ok["isError"] is False, text(ok)
    assert used(s51gw, who, "node_qm_list") == 1
    over = await call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": "busy"})
    assert over["isError"] is True and "quota.exceeded" in over["structuredContent"]["codes"], over


async def test_a_node_refusing_every_new_session_is_an_upstream_error_and_spends_no_quota(
    s51gw: GatewayThread, s51env: DevEnv, faults: Any
) -> None:
    sim, who = faults, "s51-refused"
    warm = await call(s51env, HOLDER, "node_filesystems", {"node": "pve1", "cluster": "refused"})
    assert warm["isError"] is False, text(warm)  # the pooled connection is made
    sim.set_faults(ssh_hang="^qm list$")

    async def occupy() -> list[asyncssh.SSHClientProcess[Any]]:
        """sshd's ten sessions on the gateway's own connection, each a command that does not end: the
        gateway's count (ssh.max_sessions: 10) does not know of them, so it asks the node, which refuses."""
        conn = pool(s51gw)._conns[("refused", "pve1")]
        return [await conn.create_process("qm list") for _ in range(10)]

    procs = on_gateway(s51gw, occupy())
    try:
        before = upstream_errors(s51gw, "refused", "busy")
        res = await call(s51env, who, "node_pct_list", {"node": "pve1", "cluster": "refused"})
        why = "node pve1 refused a new SSH session (open failed) for 1s"
        assert_unsent(s51env, s51gw, sim, res, why, "refused", "busy", before)
        assert used(s51gw, who, "node_pct_list") == 0
        assert not [e for e in sim.ssh_log() if e["argv"] == ["pct", "list"]]
    finally:
        sim.set_faults(ssh_hang=None)

        async def end() -> None:
            for p in procs:
                await p.wait()

        on_gateway(s51gw, end())
    # the quota is live: the call the node runs spends it, the next is refused
    ok = await call(s51env, who, "node_pct_list", {"node": "pve1", "cluster": "refused"})
    assert ok["isError"] is False, text(ok)
    assert used(s51gw, who, "node_pct_list") == 1
    over = await call(s51env, who, "node_pct_list", {"node": "pve1", "cluster": "refused"})
    assert over["isError"] is True and "quota.exceeded" in over["structuredContent"]["codes"], over


async def test_a_connection_lost_before_the_session_opened_is_an_upstream_error(
    s51gw: GatewayThread, s51env: DevEnv, faults: Any
) -> None:
    sim, who = faults, "s51-lost"
    warm = await call(s51env, HOLDER, "node_filesystems", {"node": "pve1", "cluster": "lost"})
    assert warm["isError"] is False, text(warm)
    conn = pool(s51gw)._conns[("lost", "pve1")]
    slots = pool(s51gw).slots("lost", "pve1", conn, 1)

    async def take() -> None:
        await slots.acquire()  # a command still running on the node's one session

    async def waiting() -> bool:
        async def n() -> int:
            return len(slots._waiters or ())  # type: ignore[attr-defined]

        return on_gateway(s51gw, n()) > 0

    on_gateway(s51gw, take())
    before = upstream_errors(s51gw, "lost", "unreachable")
    pending = asyncio.ensure_future(call(s51env, who, "node_qm_list", {"node": "pve1", "cluster": "lost"}))
    await until(waiting)

    async def lose() -> None:  # sshd restarted under it: the connection closes, the session comes free
        conn.close()
        await conn.wait_closed()
        slots.release()

    on_gateway(s51gw, lose())
    res = await pending
    why = "SSH connection to node pve1 was lost before the command started; nothing ran"
    assert_unsent(s51env, s51gw, sim, res, why, "lost", "unreachable", before)
    assert used(s51gw, who, "node_qm_list") == 0
    assert not [e for e in sim.ssh_log() if e["argv"] == ["qm", "list"]]


async def test_a_node_without_ssh_access_configured_is_an_upstream_error(
    s51gw: GatewayThread, s51env: DevEnv, faults: Any
) -> None:
    sim, who = faults, "s51-gap"
    cases = [
        ("gap", "pve2", "node pve2 has no SSH access configured in cluster gap (clusters.gap.ssh.nodes)"),
        ("nossh", "pve1", "cluster nossh has no SSH access configured (clusters.nossh.ssh)"),
    ]
    for cluster, node, why in cases:
        before = upstream_errors(s51gw, cluster, "unreachable")
        res = await call(s51env, who, "node_qm_list", {"node": node, "cluster": cluster})
        assert_unsent(s51env, s51gw, sim, res, why + "; nothing was sent", cluster, "unreachable", before)
        assert used(s51gw, who, "node_qm_list") == 0
    assert sim.ssh_log() == []


class RefusesExec(asyncssh.SSHServerSession[bytes]):
    """A session the node opens, then refuses its exec request (after seeing the command)."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def exec_requested(self, command: str) -> bool:
        self.seen.append(command)
        return False


def refusing_exec(seen: list[str]) -> type[AnyClientKey]:
    class Node(AnyClientKey):
        def session_requested(self) -> RefusesExec:
            return RefusesExec(seen)

    return Node


async def test_an_exec_refused_on_an_open_session_stays_a_failure_and_is_not_sent_again(tmp_path: Path) -> None:
    """The exec request reached the node: not an upstream_error, and not asked again as a refused open."""
    seen: list[str] = []
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.create_server(refusing_exec(seen), "127.0.0.1", 0, server_host_keys=[key])
    port = server.sockets[0].getsockname()[1]
    node = SSHNodeConfig("pve1", "127.0.0.1", port, key.export_public_key().decode().strip())
    ssh = SSHConfig("root", client_key(tmp_path), {"pve1": node}, command_timeout=1.0)
    cluster = ClusterConfig("default", "https://127.0.0.1:9", SecretRef(env="UNUSED"), ssh=ssh)
    rt = SshRuntime({"default": cluster}, Locator(), AllowList(CATALOG))
    try:
        with pytest.raises(ToolError) as err:
            await rt.call(CATALOG.tools["node_qm_list"], {"node": "pve1"}, CallContext("default"))
    finally:
        await rt.close()
        server.close()
        await server.wait_closed()
    assert not isinstance(err.value, UpstreamError), err.value  # it may have run: `failed`, the quota spent
    assert str(err.value) == "SSH exec on node pve1 failed (ChannelOpenError)"
    assert len(seen) == 1, seen  # sent once, never again
