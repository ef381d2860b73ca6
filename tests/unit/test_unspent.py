"""Giving an approval back never turns a refusal into another error (gateway/pipeline.py `_unspent`).

The give-back is a database write: when the store is the reason for the refusal it is not tried
(the client's 503 must not wait on a failing store), and when it fails anyway the refusal stands
as it was and the approval stays used (the safe side: a retry is refused, never run twice)."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.core.calls import CallRequest
from gateway.core.principal import Principal
from gateway.pipeline import _unspent

pytestmark = pytest.mark.asyncio

PRINCIPAL = Principal(sub="agent", iss="test", roles=(), groups=(), scopes=(), client_id=None, kind="agent")


class _Approvals:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.calls: list[str] = []

    async def release(self, approval_id: str, *_: Any) -> bool:
        self.calls.append(approval_id)
        if self.error is not None:
            raise self.error
        return True


def _req() -> CallRequest:
    return CallRequest(
        request_id="req-1", principal=PRINCIPAL, tool="vm_shutdown", arguments={}, protocol_version="2025-11-25"
    )


async def test_a_failing_give_back_leaves_the_refusal_as_it_was() -> None:
    approvals = _Approvals(sqlite3.OperationalError("database or disk is full"))
    c: Any = SimpleNamespace(approvals=approvals)
    await _unspent(c, _req(), "vm_shutdown", {}, {"id": "apr-1"}, "denied by policy")  # does not raise
    assert approvals.calls == ["apr-1"]


async def test_a_refusal_by_the_store_does_not_try_it() -> None:
    approvals = _Approvals(None)
    c: Any = SimpleNamespace(approvals=approvals)
    await _unspent(c, _req(), "vm_shutdown", {}, {"id": "apr-1"}, "store full", store_failing=True)
    await _unspent(c, _req(), "vm_shutdown", {}, None, "no approval presented")
    assert approvals.calls == []
    await _unspent(c, _req(), "vm_shutdown", {}, {"id": "apr-2"}, "quota")
    assert approvals.calls == ["apr-2"]
