"""A reconciliation pass that fails because a store is away is one line a pass, not a traceback every
10 s of an outage (seen in a replicas review with PostgreSQL halted); a bug keeps its traceback."""

from __future__ import annotations

import logging

import pytest

from gateway.store.db import DatabaseUnavailable
from gateway.store.reconcile import _pass_failed


@pytest.mark.parametrize(
    "exc",
    [DatabaseUnavailable("PostgreSQL cannot be reached: refused"), ConnectionRefusedError(111, "Connect call failed")],
)
def test_a_store_that_is_away_is_one_line(exc: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pvegate.reconcile"):
        _pass_failed("reconciliation of stale replicas failed", exc)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage().startswith(f"reconciliation of stale replicas failed: {type(exc).__name__}: ")


def test_a_bug_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pvegate.reconcile"):
        try:
            raise KeyError("bug")
        except KeyError as exc:
            _pass_failed("reconciliation pass failed", exc)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
