"""Connector runtimes: how a declared tool reaches Proxmox (API, SSH, composite)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.tools.tool import Tool


class ToolError(Exception):
    """The connector could not do what the tool asked; the message is safe for the client."""


class UpstreamError(ToolError):
    """Proxmox could not be asked: unreachable, TLS verification failed, or it rejected the
    gateway's own API token (401). Nothing was carried out. Audited as `upstream_error`, never
    as a policy decision; `cause` is unreachable | tls | auth | circuit_open."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class Refused(ToolError):
    """The runtime refused the request before anything left the gateway (e.g. an SSH allow-list miss)."""


class CommandFailed(ToolError):
    """The command ran and exited with a status the tool does not accept."""

    def __init__(self, message: str, exit_status: int) -> None:
        super().__init__(message)
        self.exit_status = exit_status


@dataclass
class ToolOutput:
    data: Any
    task_id: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CallContext:
    cluster: str
    dry_run: bool = False
    request_id: str = ""


class Runtime(Protocol):
    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput: ...

    async def close(self) -> None: ...


class GuestLocator(Protocol):
    """What a runtime asks the target resolver (gateway.tools.targets.TargetResolver): where a guest runs.
    A protocol, so the resolver may use the API client without the runtimes importing it back."""

    async def guest(self, cluster: str, vmid: int) -> dict[str, Any] | None: ...

    async def nodes(self, cluster: str) -> dict[str, dict[str, Any]]: ...

    def invalidate(self, cluster: str) -> None: ...
