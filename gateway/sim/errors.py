"""Errors raised by handlers; the API layer turns them into PVE-shaped responses."""

from __future__ import annotations


class ApiError(Exception):
    """A handler `die`: HTTP status plus PVE's message (without the trailing newline)."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def perm_denied(path: str, privs: str) -> ApiError:
    return ApiError(403, f"Permission check failed ({path}, {privs})")


def no_such_guest(node: str, kind: str, vmid: int) -> ApiError:
    d = "qemu-server" if kind == "qemu" else "lxc"
    return ApiError(500, f"Configuration file 'nodes/{node}/{d}/{vmid}.conf' does not exist")
