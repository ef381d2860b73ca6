"""A hostile SSH "node": a real asyncssh server on 127.0.0.1 that answers each command as a test
says, and the real SshRuntime pinned to it.

What the node (or a guest, through `pct exec`) prints is the node's to choose; these tests
play that part. Only the guest lookup (Proxmox's answer to "where does vmid N run") is
answered here, by `Locator`: it is not what is under test.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from gateway.core.config import ClusterConfig, SecretRef, SSHConfig, SSHNodeConfig
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import CallContext, ToolOutput
from gateway.tools.runtimes.ssh import AllowList, SshRuntime
from gateway.tools.tool import Tool

CATALOG = Catalog.load(REPO_ROOT / "connectors")
Handler = Callable[[asyncssh.SSHServerProcess[bytes]], Awaitable[None]]
GUEST = {"vmid": 200, "type": "lxc", "status": "running", "node": "pve1", "name": "docker-host"}


class AnyClientKey(asyncssh.SSHServer):
    """Public-key auth, any key: the node is the hostile party here, not the client."""

    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return True


class Locator:
    """Where guest 200 runs (pve1): the target resolver's answer, without a Proxmox."""

    async def guest(self, cluster: str, vmid: int) -> dict[str, Any] | None:
        return {**GUEST, "vmid": vmid}

    async def nodes(self, cluster: str) -> dict[str, dict[str, Any]]:
        return {"pve1": {"status": "online"}}

    def invalidate(self, cluster: str) -> None:
        return None


class GuestList:
    """The pve_api runtime's part in a composite: list_guests answers guest 200, running on pve1."""

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput:
        assert tool.name == "list_guests", tool.name
        return ToolOutput(data=[GUEST])

    async def close(self) -> None:
        return None


@dataclass
class Node:
    runtime: SshRuntime
    cluster: ClusterConfig
    commands: list[str] = field(default_factory=list)  # every command that reached the node, in order
    closed: list[str] = field(default_factory=list)  # commands whose channel the client closed before an answer


def client_key(directory: Path) -> Path:
    """The gateway's private key, written 0600 as a deployment keeps it."""
    path = directory / "client-key"
    path.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    path.chmod(0o600)
    return path


@asynccontextmanager
async def hostile_node(
    directory: Path,
    handler: Handler,
    *,
    host_keys: list[Any] | None = None,
    pinned: str | None = None,
    api_timeout: float = 10.0,
    **ssh: Any,
) -> AsyncIterator[Node]:
    """A node answering through `handler`, and an SshRuntime for cluster "default" pinned to its host key
    (or to `pinned`). `ssh` overrides SSHConfig fields (command_timeout, ...)."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    node = Node(runtime=None, cluster=None)  # type: ignore[arg-type]  # set below, once the port is known

    async def process(p: asyncssh.SSHServerProcess[bytes]) -> None:
        node.commands.append(str(p.command))
        task = asyncio.ensure_future(handler(p))
        closed = asyncio.ensure_future(p.channel.wait_closed())
        await asyncio.wait([task, closed], return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # the client gave up on it (closed its channel) while the node was still at it
            node.closed.append(str(p.command))
            task.cancel()
        closed.cancel()

    server = await asyncssh.create_server(
        AnyClientKey, "127.0.0.1", 0, server_host_keys=host_keys or [key], process_factory=process, encoding=None
    )
    try:
        port = server.sockets[0].getsockname()[1]
        host_key = pinned or key.export_public_key().decode().strip()
        config = SSHConfig("root", client_key(directory), {"pve1": SSHNodeConfig("pve1", "127.0.0.1", port, host_key)})
        cluster = ClusterConfig(
            "default", "https://127.0.0.1:9", SecretRef(env="UNUSED"), timeout=api_timeout,
            ssh=dataclasses.replace(config, **ssh),
        )  # fmt: skip
        node.cluster = cluster
        node.runtime = SshRuntime({"default": cluster}, Locator(), AllowList(CATALOG))
        try:
            yield node
        finally:
            await node.runtime.close()
    finally:
        server.close()
        await server.wait_closed()


def answer(stdout: bytes, status: int = 0) -> Handler:
    async def handle(p: asyncssh.SSHServerProcess[bytes]) -> None:
        p.stdout.write(stdout)
        p.exit(status)

    return handle
