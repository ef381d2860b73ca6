"""Checks on a request's raw header list, shared by the MCP endpoint, its ASGI guard and the admin API."""

from __future__ import annotations

from collections.abc import Iterable


def repeated(raw: Iterable[tuple[bytes, bytes]], name: bytes) -> bool:
    """True when header `name` (lowercase) appears more than once in an ASGI scope's header list.

    Starlette's `Request.headers.get` returns the first copy and its `Headers` built from a scope's dict
    the last; an intermediary may read either. A header that carries identity or origin is taken from one
    copy only, so a request carrying two is refused rather than read one way here and another there."""
    return sum(k.lower() == name for k, _ in raw) > 1
