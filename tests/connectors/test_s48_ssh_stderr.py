"""A node's (a guest's, through `pct exec`) stderr is for the error message, not a second output.

Before, stderr was read under its own fixed 64 KiB cap and going over it failed the call with
"command output exceeded the 65536-byte cap": a command that succeeded with a valid answer (docker
printing a warning per container) was reported as failed, a failed one lost its own message, and
the figure named was not the `ssh.max_output_bytes` the operator configured. Now stderr's first
64 KiB are kept (only its first line is ever shown) and the rest is read and dropped.
"""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest

from gateway.tools.runtimes.base import CallContext, CommandFailed, ToolError
from tests.connectors.hostile_ssh import CATALOG, hostile_node

NOISE = b"WARNING: No swap limit support\n" * 8000  # ~250 KiB on stderr


async def noisy_ok(p: asyncssh.SSHServerProcess[bytes]) -> None:
    p.stderr.write(NOISE)
    p.stdout.write(b'[{"dst":"10.0.0.1","dev":"vmbr0","state":["REACHABLE"]}]\n')
    p.exit(0)


async def noisy_failure(p: asyncssh.SSHServerProcess[bytes]) -> None:
    p.stderr.write(b"Error: No such object: web\n" + NOISE)
    p.exit(1)


async def test_a_command_that_succeeds_with_a_noisy_stderr_returns_its_answer(tmp_path: Path) -> None:
    async with hostile_node(tmp_path, noisy_ok) as node:
        out = await node.runtime.call(CATALOG.tools["node_arp_table"], {"node": "pve1"}, CallContext("default"))
    assert out.data == [{"dst": "10.0.0.1", "dev": "vmbr0", "state": ["REACHABLE"]}]


async def test_a_failed_command_with_a_noisy_stderr_reports_its_own_first_line(tmp_path: Path) -> None:
    async with hostile_node(tmp_path, noisy_failure) as node:
        with pytest.raises(CommandFailed) as caught:
            await node.runtime.call(
                CATALOG.tools["lxc_docker_inspect"], {"vmid": 200, "container": "web"}, CallContext("default")
            )
    assert str(caught.value) == "command exited 1 on node pve1: Error: No such object: web"


async def test_stdout_over_the_configured_cap_still_fails_naming_that_cap(tmp_path: Path) -> None:
    async def flood(p: asyncssh.SSHServerProcess[bytes]) -> None:
        p.stdout.write(b"[" + b"1," * 40_000 + b"1]\n")
        p.exit(0)

    async with hostile_node(tmp_path, flood, max_output_bytes=65_536) as node:
        with pytest.raises(ToolError, match="command output exceeded the 65536-byte cap"):
            await node.runtime.call(CATALOG.tools["node_arp_table"], {"node": "pve1"}, CallContext("default"))
