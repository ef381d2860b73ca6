"""One principal's hung SSH commands must not take every session of a node from the others.

A node's SSH connection carries at most `ssh.max_sessions` commands at once, one shared pool for
every principal. A principal that ran a command it knew hangs on that node (df on a dead NFS
mount), as many times at once as there are sessions, held them all until its own command_timeout:
another principal's well-formed SSH call to the node waited its whole timeout for a session and
failed `busy`. Each principal now holds at most its share of a node's sessions.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.resilience.helpers import call, client, fresh_config, result_of, text_of, url_of
from tests.support import GatewayThread


@pytest.fixture(scope="module")
def sshgw(renv: DevEnv) -> Iterator[GatewayThread]:
    cfg = fresh_config(renv, "ssh-share")
    clusters = {}
    for name, c in cfg.clusters.items():
        assert c.ssh is not None
        clusters[name] = dataclasses.replace(c, ssh=dataclasses.replace(c.ssh, command_timeout=2.0))
    gw = GatewayThread(dataclasses.replace(cfg, clusters=clusters, max_inflight_per_principal=32)).start()
    yield gw
    gw.stop()


async def one(renv: DevEnv, gw: GatewayThread, token: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async with client(renv) as http:
        r = await call(http, url_of(gw.config), token, tool, args)
    assert r.status_code == 200, r.text
    return result_of(r)


async def test_one_principals_hung_commands_leave_sessions_for_another(
    renv: DevEnv, rsim: Any, sshgw: GatewayThread
) -> None:
    mallory = renv.token("ssh-mallory", ["viewer"], kind="service")
    bob = renv.token("ssh-bob", ["viewer"], kind="service")
    node = {"node": "pve1"}
    warm = await one(renv, sshgw, bob, "node_qm_list", node)  # the node's connection is made
    assert not warm["isError"], text_of(warm)
    rsim.set_faults(ssh_hang="^df ")  # df hangs on this node until its timeout ends it
    stop = asyncio.Event()

    async def keep_busy() -> None:  # one of mallory's 30 calls in flight at every moment
        while not stop.is_set():
            r = await one(renv, sshgw, mallory, "node_filesystems", node)
            assert r["isError"], text_of(r)  # its own: timed out, or its sessions busy

    try:
        hung = [asyncio.ensure_future(keep_busy()) for _ in range(30)]
        await asyncio.sleep(0.5)  # mallory's commands hold the node's sessions and queue for more
        results = []
        for _ in range(4):  # before: about half failed, "all 10 SSH sessions to the node stayed busy"
            results.append(await one(renv, sshgw, bob, "node_qm_list", node))
        stop.set()
        await asyncio.gather(*hung)
        for res in results:
            assert not res["isError"], text_of(res)
    finally:
        stop.set()
        rsim.set_faults(ssh_hang=None)
    mine = await one(renv, sshgw, mallory, "node_filesystems", node)
    assert not mine["isError"], text_of(mine)  # its share is whole again once its commands have ended
