"""Handler registry and the per-request context handlers receive."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.sim.auth import Principal
from gateway.sim.errors import ApiError, no_such_guest, perm_denied
from gateway.sim.runtime import Runtime
from gateway.sim.state import Guest


@dataclass
class Reply:
    data: Any
    extra: dict[str, Any] | None = None  # e.g. {"total": N}


@dataclass
class RawBody:
    """A pre-serialised `{"data": ...}` body (hot paths cache these)."""

    body: bytes


@dataclass
class Ctx:
    rt: Runtime
    principal: Principal
    method: str
    path: str
    params: dict[str, Any]  # validated query/body + path params

    @property
    def user(self) -> str:
        return self.principal.tokenid

    def can(self, path: str, *privs: str) -> bool:
        return self.rt.acl.any(self.principal, path, list(privs))

    def require(self, path: str, *privs: str, any_of: bool = False) -> None:
        if any_of:
            if not self.can(path, *privs):
                raise perm_denied(path, "|".join(privs))
            return
        for p in privs:
            if not self.rt.acl.has(self.principal, path, p):
                raise perm_denied(path, p)

    def guest(self, kind: str) -> Guest:
        """The guest addressed by {node}/{vmid}; PVE's error if it is not on that node."""
        node = str(self.params["node"])
        vmid = int(self.params["vmid"])
        g = self.rt.cluster.guests.get(vmid)
        if g is None or g.node != node or g.type != kind:
            raise no_such_guest(node, kind, vmid)
        return g


Handler = Callable[[Ctx], Any]
ROUTES: dict[tuple[str, str], Handler] = {}


def route(method: str, template: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        ROUTES[(method, template)] = fn
        return fn

    return deco


def both(method: str, template: str) -> Callable[[Handler], Handler]:
    """Register one handler for the qemu and the lxc variant of `template` (uses {kind})."""

    def deco(fn: Handler) -> Handler:
        for kind in ("qemu", "lxc"):
            ROUTES[(method, template.replace("{kind}", kind))] = fn
        return fn

    return deco


def kind_of(path: str) -> str:
    return "lxc" if "/lxc/" in path or path.endswith("/lxc") else "qemu"


def fail(status: int, message: str) -> ApiError:
    return ApiError(status, message)
