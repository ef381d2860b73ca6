"""Limits per authenticated principal, at the door of the MCP methods that do work (tools/call, tools/list):
the counts and the summaries (mcp/principal_limits.py turns a refusal into its JSON-RPC error).

The transport guard (security.py) bounds each client *address*; the policy's quotas count only calls
that run (a denied call gives its slot back). Neither bounds one principal's token: sent from several
addresses, or through an egress proxy many principals share, it could hold every worker, and its
refused calls (each an audit row) could fill the audit's disk until `audit.min_free_mb` refuses
everyone's calls. So, per principal (its `sub`):

- at most `max_inflight_per_principal` calls in flight: one more is refused at once (`inflight`);
- at most `refused_calls_per_minute_per_principal` refusals in any 60 s (a sliding window): calls
  denied by policy (quotas included) or approval, invalid arguments, an unknown tool, a refused
  requestState, a protocol fault (not a call held for approval, not an upstream failure, not
  anything allowed). Once that many are in the window, the principal's calls are refused at the
  door (`refusal_budget`) until the oldest of them is a window old: the reply says how long.

A door refusal (Limited; at the MCP layer a JSON-RPC error -32012, HTTP 429 with Retry-After) is
decided before validation, OPA or the audit: nothing is sent anywhere. It is not audited one row each
but counted, and one `refusal` row per principal and minute (outcome `suppressed`, body:
principal, count, outcomes, window) sums them up: the auth failures' machinery (store/auth_failures.py)
with no full rows, keyed by principal. A protocol fault from a principal over its budget is answered as
usual but counted there too, not written. pvegate_principal_limited_total{reason} counts every door
refusal (no principal in a label).

State is per process: each replica keeps its own counts (N replicas behind a balancer let a principal
N times the budget and N times the calls in flight, at most).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.store.audit import AuditLog, AuditRecord
from gateway.store.auth_failures import AuthFailures, _Counted

log = logging.getLogger("pvegate.principal_limits")

WINDOW_SECONDS = 60.0
RETRY_AFTER_INFLIGHT_SECONDS = 1
INFLIGHT = "inflight"  # the reasons: pvegate_principal_limited_total{reason}, error data, summary outcomes
REFUSAL_BUDGET = "refusal_budget"
REASONS = (INFLIGHT, REFUSAL_BUDGET)
SURFACE = "mcp"
MAX_PRINCIPALS = 10_000  # principals named in one window's summaries; beyond, one "*" summary


class Limited(Exception):
    """A call refused at its principal's door: counted (a summary row), never audited one by one."""

    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class DoorRefusals(AuthFailures):
    """Door refusals, counted per principal and summed up in one `refusal` row per principal and
    window (no full rows): the auth failures' windows, sweep, shutdown and memory bound."""

    key_field = "principal"
    what = "door refusal"

    def __init__(self, audit: AuditLog, *, window_seconds: float = WINDOW_SECONDS, **kw: Any) -> None:
        kw.setdefault("max_sources", MAX_PRINCIPALS)
        kw.setdefault("max_summaries", kw["max_sources"])
        super().__init__(audit, per_source=0, window_seconds=window_seconds, **kw)

    # a principal's key is its sub behind a prefix, so that a sub that is literally "*" is never the
    # aggregate of the principals folded beyond max_sources (whose rows name no principal)
    def key_of(self, ident: str | None) -> str | None:
        return None if ident is None else "sub:" + ident

    def principal_of(self, key: str | None) -> str | None:
        return key[4:] if key is not None and key.startswith("sub:") else None

    def shown_key(self, key: str | None) -> str | None:
        return self.principal_of(key) if key is not None and key.startswith("sub:") else key

    def _reason(self, kind: str, counted: _Counted) -> str:
        return (
            f"{counted.suppressed} request(s) of this principal were refused at its door (too many calls in "
            "flight, or too many refused calls in the last minute; a protocol fault while over that budget "
            "is answered as usual and counted here) and counted, not recorded one by one (one summary per "
            f"principal per {self.window_seconds:g} s)"
        )

    async def count(self, principal: str, outcome: str) -> None:
        """One door refusal; writes the summaries due (never raises: kept for the next try)."""
        rec = AuditRecord(uuid.uuid4().hex, "refusal", principal, None, None, outcome)
        await self.record(rec, source_ip=principal, surface=SURFACE, raise_errors=False)


class PrincipalLimits:
    """Per-principal calls in flight and refusal budget (see module). `clock` (monotonic seconds) and
    `window_seconds` are the budget's: tests move them instead of waiting a minute."""

    def __init__(
        self,
        *,
        max_inflight: int,
        refusals_per_window: int,
        summaries: DoorRefusals,
        on_limited: Callable[[str], None] | None = None,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_inflight < 1 or refusals_per_window < 1 or window_seconds <= 0:
            raise ValueError("max_inflight and refusals_per_window must be at least 1, window_seconds above 0")
        self.max_inflight = max_inflight
        self.refusals_per_window = refusals_per_window
        self.window_seconds = window_seconds
        self.clock = clock
        self.summaries = summaries
        self.on_limited = on_limited  # metrics: pvegate_principal_limited_total{reason}
        self.inflight: dict[str, int] = {}
        # per principal: when its latest refusals were (at most refusals_per_window: the oldest drop off)
        self.refusals: dict[str, deque[float]] = {}
        self._next_prune = 0.0

    # --- the budget ----------------------------------------------------------------------------------

    def refused(self, principal: str) -> None:
        """One of the principal's calls was refused (and audited)."""
        now = self.clock()
        self._prune(now)
        times = self.refusals.get(principal)
        if times is None:
            times = self.refusals[principal] = deque(maxlen=self.refusals_per_window)
        times.append(now)

    def throttled_for(self, principal: str) -> float | None:
        """Seconds until the principal's budget has room again, or None when it has now."""
        times = self.refusals.get(principal)
        if times is None or len(times) < self.refusals_per_window:
            return None
        wait = times[0] + self.window_seconds - self.clock()
        return wait if wait > 0 else None

    def _prune(self, now: float) -> None:
        """Forget principals with no refusal in the last window (once a window: the memory stays bounded
        by the principals refused lately)."""
        if now < self._next_prune:
            return
        self._next_prune = now + self.window_seconds
        horizon = now - self.window_seconds
        for principal in [p for p, times in self.refusals.items() if not times or times[-1] <= horizon]:
            del self.refusals[principal]

    # --- the door ------------------------------------------------------------------------------------

    async def limited(self, principal: str, reason: str, outcome: str | None = None) -> None:
        """A request refused at the door, or a protocol fault of a principal over its budget (`outcome`
        protocol_error): counted, by `reason` in the metric and `outcome` (default: the reason) in the
        summary."""
        if self.on_limited is not None:
            self.on_limited(reason)
        await self.summaries.count(principal, outcome or reason)

    async def over_budget(self, principal: str, outcome: str) -> bool:
        """A refusal that would be audited (a protocol fault, a refused vote): True, counted in the
        summary and not to be written, when the principal is over its refusal budget."""
        if self.throttled_for(principal) is None:
            return False
        await self.limited(principal, REFUSAL_BUDGET, outcome)
        return True

    async def enter(self, principal: str) -> None:
        """Take one of the principal's call slots (give it back with leave()); Limited (counted) when its
        refusal budget is spent or all its slots are taken."""
        wait = self.throttled_for(principal)
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            await self.limited(principal, REFUSAL_BUDGET)
            raise Limited(
                REFUSAL_BUDGET,
                f"Too many refused calls: {self.refusals_per_window} of this principal's calls were refused in the "
                f"last {self.window_seconds:g} s (refused_calls_per_minute_per_principal). Its calls are refused "
                f"for {seconds} s more; retry after that, and fix what got them refused first (denied by "
                "policy, invalid arguments, unknown tools: each reply said why).",
                seconds,
            )
        if self.inflight.get(principal, 0) >= self.max_inflight:
            await self.limited(principal, INFLIGHT)
            raise Limited(
                INFLIGHT,
                f"Too many calls in flight: this principal already has {self.max_inflight} calls being handled "
                f"(max_inflight_per_principal). Retry in {RETRY_AFTER_INFLIGHT_SECONDS} s, or when one has finished.",
                RETRY_AFTER_INFLIGHT_SECONDS,
            )
        self.inflight[principal] = self.inflight.get(principal, 0) + 1

    def leave(self, principal: str) -> None:
        left = self.inflight.get(principal, 1) - 1
        if left > 0:
            self.inflight[principal] = left
        else:
            self.inflight.pop(principal, None)

    @contextlib.asynccontextmanager
    async def admit(self, principal: str) -> AsyncIterator[None]:
        """One of the principal's call slots for the block (enter, then leave)."""
        await self.enter(principal)
        try:
            yield
        finally:
            self.leave(principal)
