"""Never lose the outcome of an action: store checks, in-flight calls, drain, and an outbox.

- Before anything is sent, the audit store must be able to take the records that
  follow (the dispatch record, the result): `check_store` refuses a call when the
  state directory has less free space than the reserve, or the last write failed
  moments ago, with a clear `AuditUnavailable` (a JSON-RPC error, never a bare 500).
- Every tools/call is tracked while it runs, so a SIGTERM can drain: no new calls
  (503), calls in flight finish within the grace period, and what is still waiting
  on Proxmox after it is cut off and recorded as `interrupted` with its UPID.
- A record that could not be written after Proxmox acted (disk filled mid-call) is
  kept in an outbox and written as soon as the store takes writes again; if the
  process dies first, reconciliation (gateway/store/reconcile.py) finds the outcome.

The health surface reads `store_problem(check_space=False)` from here (readiness is red while calls
are refused for the store: gateway/observability/health.py), the metrics `counters`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gateway.store.audit import (
    CALL_SECRETS,
    AuditClosed,
    AuditIntegrityError,
    AuditLog,
    AuditRecord,
    AuditStoreError,
    LeaseLost,
)
from gateway.store.db import DatabaseUnavailable

log = logging.getLogger("pvegate.outcomes")

T = TypeVar("T")

# JSON-RPC codes in the implementation-defined band (-32000..-32019; the SDK uses -32000/-32001)
AUDIT_UNAVAILABLE = -32010
SHUTTING_DOWN = -32011
RETRY_AFTER_SECONDS = 5
# what a failed audit write raises when the store itself is unwell (full, I/O, locked, no authenticated head,
# PostgreSQL unreachable) (a record of its own that cannot be written is the caller's problem, never a reason
# to refuse others)
# DatabaseUnavailable: PostgreSQL (approvals, quotas) cannot be reached; the call is refused the same way
STORE_ERRORS = (sqlite3.OperationalError, AuditClosed, AuditIntegrityError, AuditStoreError, DatabaseUnavailable)
STORE_ERROR_HOLD_SECONDS = 2.0  # after a failed write, refuse for this long unless a write succeeds


class AuditUnavailable(Exception):
    """The audit store cannot take writes: the call is refused before anything is sent."""


class ClaimLost(AuditUnavailable):
    """A replica paused or cut off for too long gave up its calls to the others: refused unsent."""


class Interrupted(Exception):
    """The call was cut off by a shutdown after its grace period."""


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass
class Flight:
    """One tools/call in progress."""

    request_id: str
    started: float = field(default_factory=time.monotonic)
    task: asyncio.Task[Any] | None = None  # the connector call, while it runs
    task_id: str | None = None  # the Proxmox UPID, once accepted
    dispatched: bool = False
    cut: bool = False
    # the quota slot the call took (principal, tool, slot): given back when the call ends with nothing sent
    quota_slot: tuple[str, str, float] | None = None


@dataclass
class Counters:
    """Plain counters for metrics (this process only)."""

    dispatch_records: int = 0
    refused_store: int = 0  # calls refused because the audit store could not take writes
    refused_draining: int = 0  # requests answered 503 during a drain
    refused_lease: int = 0  # mutations not sent: the replica's heartbeat went stale after their decision
    interrupted: int = 0  # calls cut off at the end of a drain
    kept: int = 0  # records held in the outbox after a failed write
    kept_written: int = 0  # of those, written later
    reconciled: int = 0  # calls settled by reconciliation (outcome reconciled)
    reconciled_reads: int = 0  # reads / dry runs settled as interrupted (nothing changed)


class Outcomes:
    def __init__(self, audit: AuditLog, *, grace_seconds: float, min_free_bytes: int) -> None:
        self.audit = audit
        self.grace_seconds = grace_seconds
        self.min_free_bytes = min_free_bytes
        self.draining = False  # set the moment a SIGTERM arrives: readiness goes red, new calls get 503
        self.cutting = False
        self.counters = Counters()
        self.flights: dict[str, Flight] = {}
        self.outbox: list[AuditRecord] = []
        # request ids of mutations this process left `interrupted` (outcome unknown), for reconciliation
        self.unsettled: set[str] = set()
        self.last_store_error: str | None = None
        self._store_error_at = 0.0
        self._idle = asyncio.Event()
        self._idle.set()
        self._flusher: asyncio.Task[None] | None = None
        # told what Proxmox said when reconciliation settles a call (the metrics hook the service wires)
        self.on_reconciled: Callable[[str], None] | None = None
        # told the request id of every call reconciliation settles (its pool hold is given back then)
        self.on_settled: Callable[[str], Awaitable[None]] | None = None
        # told the request id of a call reconciliation found still running in Proxmox (its hold is renewed)
        self.on_running: Callable[[str], Awaitable[None]] | None = None

    # --- the store ---------------------------------------------------------------------

    def store_problem(self, *, check_space: bool = True) -> str | None:
        """Why the audit store cannot take writes now, or None (cheap: one statvfs). Readiness asks
        with `check_space` False: no I/O on its path (its own probe checks the same floor off the loop)."""
        if self.outbox:
            return f"{len(self.outbox)} audit record(s) are still waiting to be written"
        if self.last_store_error and time.monotonic() - self._store_error_at < STORE_ERROR_HOLD_SECONDS:
            return f"the last audit write failed ({self.last_store_error})"
        if not check_space or self.audit.local_dir is None:  # PostgreSQL: its disk is the server's
            return None
        try:
            free = free_bytes(self.audit.local_dir)
        except OSError as exc:
            return f"cannot check the audit store's free space ({exc.strerror})"
        if free < self.min_free_bytes:
            reserve = self.min_free_bytes // 1024
            return f"the audit store's filesystem has {free // 1024} KiB free, below the {reserve} KiB reserve"
        return None

    async def hold(self, replica: str | None) -> None:
        """Right before a mutation is sent: this process still owns the call (AuditLog.hold renews its
        heartbeat), or the call is refused unsent (ClaimLost; the pipeline records the refusal). A
        store that cannot renew the heartbeat refuses the call too (AuditUnavailable)."""
        try:
            await self.audit.hold(replica)
        except LeaseLost as exc:
            self.counters.refused_lease += 1
            raise ClaimLost(str(exc)) from exc
        except STORE_ERRORS as exc:
            raise self.unavailable(exc) from exc

    def store_ok(self) -> bool:
        """The audit store takes writes: no call is refused for it now (store_problem)."""
        return self.store_problem() is None

    def check_store(self) -> None:
        problem = self.store_problem()
        if problem is not None:
            self.counters.refused_store += 1
            raise AuditUnavailable(problem)

    def store_failed(self, exc: BaseException) -> None:
        self.last_store_error = str(exc) or type(exc).__name__
        self._store_error_at = time.monotonic()
        log.error("audit write failed: %s", self.last_store_error)

    @property
    def store_error_at(self) -> float:
        """When (time.monotonic) the last store failure was told (store_failed); 0.0: never."""
        return self._store_error_at

    def unavailable(self, exc: BaseException) -> AuditUnavailable:
        """The refusal for a store error: remembered for the health signal, then raised by the caller."""
        self.store_failed(exc)
        return AuditUnavailable(f"the audit store cannot take writes ({self.last_store_error})")

    def store_recovered(self) -> None:
        if self.last_store_error is not None:
            log.warning("audit store takes writes again")
        self.last_store_error = None

    async def append(self, *records: AuditRecord) -> None:
        """audit.append, remembering failures for the health signal; raises AuditUnavailable."""
        try:
            await self.audit.append(*records)
        except STORE_ERRORS as exc:
            raise self.unavailable(exc) from exc
        self.store_recovered()

    async def settle(self, *records: AuditRecord) -> bool:
        """Write records about something Proxmox already did; if the store cannot take them now,
        keep them (in order) and write them when it can. True if written now."""
        if not self.outbox:
            try:
                await self.append(*records)
                return True
            except AuditUnavailable:
                pass
        self.keep(*records)
        return False

    def keep(self, *records: AuditRecord) -> None:
        """Keep records (in order) for the flusher, without trying the store now: for a store just
        found failing, where a write could hang until its timeout while a client waits."""
        secrets = CALL_SECRETS.get()  # the flusher runs outside this call's context
        self.outbox.extend(dataclasses.replace(r, scrub=r.scrub + secrets) for r in records)
        self.counters.kept += len(records)
        log.error("kept %d audit record(s) in memory until the store takes writes again", len(records))

    async def flush(self) -> bool:
        """Write what the outbox holds; True when it is empty."""
        while self.outbox:
            batch = list(self.outbox)
            try:
                await self.append(*batch)
            except AuditUnavailable:
                return False
            del self.outbox[: len(batch)]
            self.counters.kept_written += len(batch)
            log.warning("wrote %d kept audit record(s)", len(batch))
        return True

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.outbox:
                await self.flush()

    def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_loop(), name="audit-outbox")

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self.outbox and not await self.flush():
            log.error(
                "%d audit record(s) could not be written before exit; `pvegate audit reconcile` recovers "
                "their outcome from Proxmox",
                len(self.outbox),
            )

    # --- calls in flight ------------------------------------------------------------------

    @contextlib.contextmanager
    def flight(self, request_id: str) -> Iterator[Flight]:
        f = Flight(request_id)
        self.flights[request_id] = f
        self._idle.clear()
        try:
            yield f
        finally:
            self.flights.pop(request_id, None)
            if not self.flights:
                self._idle.set()

    async def run(self, flight: Flight, call: Awaitable[T]) -> T:
        """Run the connector call so a drain can cut it off (Interrupted), leaving the rest of
        the call (its interrupted record, its answer to the client) to finish normally."""
        if self.cutting:
            close = getattr(call, "close", None)
            if close is not None:
                close()  # never started: no "coroutine was never awaited"
            raise Interrupted("the gateway is shutting down; nothing was sent")
        task: asyncio.Task[T] = asyncio.ensure_future(call)
        flight.task = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if flight.cut and (current is None or not current.cancelling()):
                raise Interrupted(f"the gateway shut down (grace period {self.grace_seconds:g}s ended)") from None
            raise
        finally:
            flight.task = None

    def cut(self) -> None:
        """Cut off every call still waiting on its connector."""
        self.cutting = True
        for f in list(self.flights.values()):
            f.cut = True
            if f.task is not None:
                f.task.cancel()

    async def drain(self) -> None:
        """Stop taking calls, let those in flight finish within the grace period, cut off the rest."""
        self.draining = True
        log.warning(
            "draining: %d call(s) in flight, grace period %gs; new calls get 503",
            len(self.flights),
            self.grace_seconds,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout=self.grace_seconds)
        if self.flights:
            log.error("grace period ended: cutting off %d call(s) in flight", len(self.flights))
            self.cut()
            with contextlib.suppress(TimeoutError):  # they record `interrupted` and answer
                await asyncio.wait_for(self._idle.wait(), timeout=10.0)
        await self.flush()
