"""Connector runtimes: how a declared tool reaches Proxmox (API, SSH, composite)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.catalog import Tool


class ToolError(Exception):
    """The connector could not do what the tool asked; the message is safe for the client."""


class Refused(ToolError):
    """The runtime refused the request before anything left the gateway (e.g. an SSH allow-list miss)."""


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
