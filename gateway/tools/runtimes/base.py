"""Connector runtimes: how a declared tool reaches Proxmox (API, SSH, composite)."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.tools.tool import Tool


class ToolError(Exception):
    """The connector could not do what the tool asked; the message is safe for the client."""


class UpstreamError(ToolError):
    """Proxmox could not be asked: unreachable, TLS verification failed, or it rejected the
    gateway's own API token (401); or no SSH connection to the node was made (refused, timed out,
    host key not the pinned one, the gateway's key refused), no SSH session for the command was
    opened (all busy, refused, the connection closed first), or the node has no SSH access
    configured, so no command was sent. Nothing was
    carried out. Audited as `upstream_error`, never as a policy decision; `cause` is unreachable |
    tls | host_key | auth | circuit_open | busy (the gateway's own connections to the API were all
    taken by other calls)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class Refused(ToolError):
    """The runtime refused the request before anything left the gateway (e.g. an SSH allow-list miss)."""


class AnswerLost(ToolError):
    """The request was sent but its answer never came (a read timeout, a cut connection): for a
    mutation, Proxmox may have carried it out. Its outcome is looked up, never assumed."""


class TaskFailed(ToolError):
    """The Proxmox task ran and ended with an error: its outcome is known (unlike a lost poll)."""


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
    # the Proxmox task was still running when the wait ended (task_timeout): its outcome is not known yet
    task_running: bool = False


TEST_FAULT_ENV = "PVEGATE_TEST_FAULT"


def test_fault(name: str) -> bool:
    """A fault the tests inject into a real gateway process (docs/audit.md: test only)."""
    return os.environ.get(TEST_FAULT_ENV) == name


def freeze_for_test(name: str) -> None:
    """Tests only: the process stops itself (SIGSTOP, as a suspended VM) when fault `name` is set,
    and goes on where it was once the test sends SIGCONT."""
    if test_fault(name):
        os.kill(os.getpid(), signal.SIGSTOP)


# Called with what was dispatched ({"task_id": UPID, "node": ...} or the SSH node and argv) the
# moment Proxmox accepted a mutation or an SSH command started, before the runtime waits on it:
# the pipeline makes that fact durable in the audit.
OnDispatch = Callable[[dict[str, Any]], Awaitable[None]]
# Awaited right before a request that may change something leaves the gateway; raises to keep it unsent
# (the pipeline's: this replica still owns the call, docs/deployment.md).
BeforeSend = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class CallContext:
    cluster: str
    dry_run: bool = False
    request_id: str = ""
    on_dispatch: OnDispatch | None = field(default=None, compare=False)
    before_send: BeforeSend | None = field(default=None, compare=False)


class Runtime(Protocol):
    def check(self, tool: Tool, arguments: dict[str, Any]) -> None:
        """Refuse (Refused) validated arguments this connector could not send as given, before the policy
        decides on them: a property string filled only in part (pve_api) is no call to approve."""

    async def call(self, tool: Tool, arguments: dict[str, Any], ctx: CallContext) -> ToolOutput: ...

    async def close(self) -> None: ...


class GuestLocator(Protocol):
    """What a runtime asks the target resolver (gateway.tools.targets.TargetResolver): where a guest runs.
    A protocol, so the resolver may use the API client without the runtimes importing it back."""

    async def guest(self, cluster: str, vmid: int) -> dict[str, Any] | None: ...

    async def nodes(self, cluster: str) -> dict[str, dict[str, Any]]: ...

    def invalidate(self, cluster: str) -> None: ...
