"""Auth failures and other refusals without an identity, bounded in the audit: no one who can reach the
port can grow the audit without limit.

A request refused before anyone is identified costs its sender nothing: a missing, forged or wrong
credential (kind `auth_failure`, surfaces mcp, admin, metrics), a request the transport guard refuses
before authentication (kind `refusal`: wrong Host, bad Origin, a body too large, cut short or too slow,
too many requests in flight; surface transport), a console sign-in refused at /admin/callback (kind
`console`, action sign_in, outcome refused; surface console). Each used to write a row. The audit is
fail-closed (a store that cannot take writes refuses every call), so filling its disk with such rows
would have stopped the gateway for everyone. They are still recorded, but in fixed windows
(`WINDOW_SECONDS`, aligned to the clock):

- the first `per_source` of a window from one source are audited in full, as before, whatever their
  kind: the kinds share one budget per source (one source: an IPv4 address, an IPv6 client's /64
  network, which one client holds as a whole);
- beyond that, and once `per_source * TOTAL_FACTOR` rows were written in the window in all, a refused
  request is only counted: by source, kind (and action), outcome and surface;
- when the window is over, one summary row per source and kind with requests only counted is written,
  in the refused rows' own kind (`auth_failure`, `refusal`, `console`), outcome `suppressed`, body:
  source_ip, count, audited, window_start, window_end, outcomes, surfaces (and `action` for the
  console's): by the first refused request of a later window, by a background sweep a moment after the
  window ends, and at shutdown (`close`). No count is lost short of a crash (which loses the current
  window's counts only: they live in memory until then).

At most `max_sources` sources are tracked per window; a new source beyond that, or one first seen once
the window's rows in all are spent, shares the aggregate source "*" (same bound; its summaries say
source_ip "*"). So a window costs at most `per_source * TOTAL_FACTOR` full rows plus one summary row
per tracked source and kind, however many addresses send them, and the memory is bounded as well.

The client's answer does not change (the same 401, 403, 421, ...): a request that is only counted
writes nothing, so it is not refused with a 503 when the audit cannot take writes. Every one, recorded
or counted, is in `counts` (pvegate_unauthenticated_refusals_total{surface, recorded}).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.store.audit import AuditLog, AuditRecord

log = logging.getLogger("pvegate.auth_failures")

KIND = "auth_failure"  # the kind the bound was first written for; a summary takes its rows' kind
SUPPRESSED = "suppressed"  # the summary row's outcome
WINDOW_SECONDS = 60.0
PER_SOURCE = 20  # full rows per source and window (config: audit.auth_failure_rows_per_minute)
TOTAL_FACTOR = 50  # full rows per window in all: this many times the per-source bound
MAX_SOURCES = 10_000  # sources tracked one by one per window; beyond, the aggregate
AGGREGATE = "*"
# known from the start, so their series exist before a failure: auth failures on /mcp, the admin API and
# /metrics; refusals before authentication by the transport guard; refused console sign-ins
SURFACES = ("mcp", "admin", "metrics", "transport", "console")
# how a summary's reason names what it counted, by kind
NOUNS = {
    "auth_failure": "auth failure(s)",
    "refusal": "refusal(s) before authentication",
    "console": "refused console sign-in(s)",
}
SWEEP_MARGIN_SECONDS = 1.0  # the sweep runs this long after a window's end
IPV6_PREFIX = 64


def source_of(ip: str | None) -> str | None:
    """The source a failure is counted against: the address, an IPv6 client's /64 network (one client
    holds a whole /64 and could otherwise pick a fresh address for every request)."""
    if ip is None:
        return None
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, IPV6_PREFIX), strict=False))
    return str(addr)


_Group = tuple[str, str | None]  # (kind, action): what one summary row stands for


def _group(record: AuditRecord) -> _Group:
    action = (record.body or {}).get("action")
    return record.kind, action if isinstance(action, str) else None


@dataclass
class _Counted:
    """One source's refused requests of one kind (and action) this window."""

    audited: int = 0  # full rows written
    suppressed: int = 0  # only counted
    outcomes: dict[str, int] = field(default_factory=dict)
    surfaces: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str, surface: str) -> None:
        """One more request only counted."""
        self.suppressed += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.surfaces[surface] = self.surfaces.get(surface, 0) + 1

    def add(self, other: _Counted) -> None:
        """Fold `other` in: several sources (or windows) summed into one summary."""
        self.audited += other.audited
        self.suppressed += other.suppressed
        for mine, theirs in ((self.outcomes, other.outcomes), (self.surfaces, other.surfaces)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v

    @classmethod
    def of_summary(cls, body: dict[str, Any]) -> _Counted:
        """The counts a summary row's body holds (one kept unwritten)."""
        return cls(
            audited=int(body.get("audited", 0)),
            suppressed=int(body.get("count", 0)),
            outcomes={k: int(v) for k, v in (body.get("outcomes") or {}).items()},
            surfaces={k: int(v) for k, v in (body.get("surfaces") or {}).items()},
        )


@dataclass
class _Source:
    audited: int = 0  # full rows written this window, of every kind: the budget they share
    groups: dict[_Group, _Counted] = field(default_factory=dict)

    @property
    def suppressed(self) -> int:  # only counted this window, of every kind
        return sum(g.suppressed for g in self.groups.values())


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AuthFailures:
    """Writes auth failures and refusals without an identity to the audit, at most `per_source` rows
    per source and window, of all kinds together (see module).

    Also the machinery of other bounded refusals (store/principal_limits.py: refusals at a principal's
    door, keyed by principal): a subclass names its key (`key_field`, `key_of`, `principal_of`) and
    its summaries (`_reason`); `per_source` 0 counts every one (no full rows)."""

    key_field = "source_ip"  # what a summary's body calls the key it counted by
    what = "auth failure"  # what the log calls these summaries

    def __init__(
        self,
        audit: AuditLog,
        *,
        per_source: int = PER_SOURCE,
        window_seconds: float = WINDOW_SECONDS,
        max_sources: int = MAX_SOURCES,
        total: int | None = None,
        max_summaries: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if per_source < 0 or window_seconds <= 0 or max_sources < 1:
            raise ValueError("per_source must be at least 0, max_sources at least 1, window_seconds above 0")
        self.audit = audit
        self.per_source = per_source
        self.window_seconds = window_seconds
        self.max_sources = max_sources
        self.total = total if total is not None else per_source * TOTAL_FACTOR
        # summaries named one by one per window; the rest folded into one "*" summary per kind
        self.max_summaries = max_summaries if max_summaries is not None else max(self.total, 1)
        self.clock = clock  # wall time: the summaries name their windows in it
        # every failure seen, by (surface, recorded): recorded is "row" (audited in full) or "suppressed"
        self.counts: dict[tuple[str, str], int] = {(s, r): 0 for s in SURFACES for r in ("row", SUPPRESSED)}
        self._window: int | None = None  # the current window's index (start / window_seconds)
        self._sources: dict[str | None, _Source] = {}
        self._rows = 0  # full rows written this window, in all
        self._unwritten: list[AuditRecord] = []  # summaries whose write failed: tried again with the next
        self._sweeper: asyncio.Task[None] | None = None
        self._closed = False

    def key_of(self, ident: str | None) -> str | None:
        """What a refusal is counted against: here its source (see source_of)."""
        return source_of(ident)

    def principal_of(self, key: str | None) -> str | None:
        """The principal a summary row is written under: none for a source address."""
        return None

    def shown_key(self, key: str | None) -> str | None:
        """The key as a summary's body names it."""
        return key

    # --- the writers' entry point --------------------------------------------------------------------

    async def record(
        self, record: AuditRecord, *, source_ip: str | None, surface: str, raise_errors: bool = True
    ) -> None:
        """Audit one refused request (`record`: an `auth_failure`, a pre-auth `refusal`, a refused
        console sign-in), or count it; with any summaries that are due, in one transaction. Raises what
        AuditLog.append raises when a row was to be written and could not be (`raise_errors` False,
        for a request only counted: logged, the summaries kept for the next try)."""
        now = self.clock()
        due = self._roll(now)
        key = self.key_of(source_ip)
        src = self._sources.get(key)
        if src is None:
            # tracked by address even once the window's rows are spent (its summary names it: an
            # attacker cannot hide behind others' failures); only the memory bound folds addresses
            if len(self._sources) >= self.max_sources:
                key = AGGREGATE
            src = self._sources.setdefault(key, _Source())
        counted = src.groups.setdefault(_group(record), _Counted())
        row = None
        if src.audited < self.per_source and self._rows < self.total:
            src.audited += 1
            counted.audited += 1
            self._rows += 1
            recorded = "row"
            row = record
        else:
            counted.count(record.outcome or "-", surface)
            recorded = SUPPRESSED
            self._ensure_sweeper()
        self.counts[(surface, recorded)] = self.counts.get((surface, recorded), 0) + 1
        if due or row is not None:
            await self._write(due, row, raise_errors=raise_errors or row is not None)

    # --- windows --------------------------------------------------------------------------------------

    def _roll(self, now: float, *, end: float | None = None) -> list[AuditRecord]:
        """Start the window `now` falls in when it is a later one, or end the current one at `end`
        (shutdown); returns the summaries then due: any whose earlier write failed, then those of the
        window that ended. Nothing within a window (and while the clock goes back: kept until it is over)."""
        index = math.floor(now / self.window_seconds)
        if end is None and self._window is not None and index <= self._window:
            return []
        ended, sources = self._window, self._sources
        self._window, self._sources, self._rows = index, {}, 0
        due, self._unwritten = self._unwritten, []
        if ended is None:
            return due
        start = ended * self.window_seconds
        stop = start + self.window_seconds if end is None else max(start, min(start + self.window_seconds, end))
        counted_by = sorted(
            ((key, group, counted) for key, src in sources.items() for group, counted in src.groups.items()),
            key=lambda e: -e[2].suppressed,
        )
        counted_by = [e for e in counted_by if e[2].suppressed]
        # at most `total` summaries a window, the largest counts named (whoever sends most is never folded
        # away); the rest folded into one per kind, so many addresses cannot turn summaries into a flood
        named, rest = counted_by[: self.max_summaries], counted_by[self.max_summaries :]
        due += [self._summary(key, group, counted, start, stop) for key, group, counted in named]
        folded: dict[_Group, _Counted] = {}
        for _, group, counted in rest:
            folded.setdefault(group, _Counted()).add(counted)
        due += [self._summary(AGGREGATE, group, counted, start, stop) for group, counted in folded.items()]
        return due

    def _summary(self, key: str | None, group: _Group, counted: _Counted, start: float, stop: float) -> AuditRecord:
        """The summary row of one source's refused requests of one kind (and action): in that kind, so a
        reader who looks for one kind of row finds its count too."""
        kind, action = group
        body: dict[str, Any] = {
            "reason": self._reason(kind, counted),
            self.key_field: self.shown_key(key),
            "count": counted.suppressed,
            "audited": counted.audited,
            "window_start": _iso(start),
            "window_end": _iso(stop),
            "outcomes": dict(sorted(counted.outcomes.items())),
            "surfaces": dict(sorted(counted.surfaces.items())),
        }
        if action is not None:
            body["action"] = action
        return AuditRecord(uuid.uuid4().hex, kind, self.principal_of(key), outcome=SUPPRESSED, body=body)

    def _reason(self, kind: str, counted: _Counted) -> str:
        return (
            f"{counted.suppressed} more {NOUNS.get(kind, kind + ' row(s)')} from this source were "
            f"counted, not recorded one by one (at most {self.per_source} rows per source per "
            f"{self.window_seconds:g} s, for auth failures, refusals before authentication and refused "
            "console sign-ins together)"
        )

    def pending(self) -> int:
        """Refused requests counted but not yet written in a summary."""
        return sum(s.suppressed for s in self._sources.values()) + sum(
            int((r.body or {}).get("count", 0)) for r in self._unwritten
        )

    async def _write(self, summaries: list[AuditRecord], row: AuditRecord | None = None, *, raise_errors: bool) -> bool:
        """The summaries (and a failure's own row after them) in one transaction. Summaries that cannot be
        written are kept for the next try; a row that cannot be written fails its request, as before."""
        try:
            await self.audit.append(*summaries, *([row] if row is not None else []))
        except Exception:
            self._keep(summaries)
            if raise_errors:
                raise
            log.warning(
                "%s summaries not written yet (%d refused requests); tried again later", self.what, self.pending()
            )
            return False
        return True

    def _keep(self, summaries: list[AuditRecord]) -> None:
        """Summaries that could not be written, kept for the next write; more than `max_sources` of them
        (a store down for many windows) are folded into one per kind (and action), so the memory stays
        bounded."""
        kept = summaries + self._unwritten
        if len(kept) > self.max_sources:
            groups: dict[_Group, list[dict[str, Any]]] = {}
            for r in kept:
                groups.setdefault(_group(r), []).append(r.body or {})
            kept = [self._fold(group, bodies) for group, bodies in groups.items()]
        self._unwritten = kept
        if kept:
            self._ensure_sweeper()

    def _fold(self, group: _Group, bodies: list[dict[str, Any]]) -> AuditRecord:
        folded = _Counted()
        for b in bodies:
            folded.add(_Counted.of_summary(b))
        start = min(_parse(b.get("window_start")) for b in bodies)
        stop = max(_parse(b.get("window_end")) for b in bodies)
        return self._summary(AGGREGATE, group, folded, start, stop)

    # --- the sweep and shutdown ------------------------------------------------------------------------

    def _ensure_sweeper(self) -> None:
        if self._closed or (self._sweeper is not None and not self._sweeper.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (never on the serving path): the next window's first failure or close
            self._sweeper = None
            return
        # a context of its own: not the request's that happened to start it (its log context, call secrets)
        self._sweeper = loop.create_task(self._sweep(), name="pvegate-auth-failures", context=contextvars.Context())

    async def _sweep(self) -> None:
        """Writes a window's summaries shortly after it ends, when no later failure did; ends when none
        are left to write."""
        while self.pending():
            window = self._window if self._window is not None else math.floor(self.clock() / self.window_seconds)
            wait = (window + 1) * self.window_seconds - self.clock()
            await asyncio.sleep(max(wait, 0.0) + SWEEP_MARGIN_SECONDS)
            due = self._roll(self.clock())
            if due:
                await self._write(due, raise_errors=False)

    async def sweep(self) -> None:
        """Write what is due now (the summaries of windows that are over)."""
        due = self._roll(self.clock())
        if due:
            await self._write(due, raise_errors=False)

    async def close(self) -> None:
        """Shutdown: the current window's summaries (ending now) and any unwritten ones, before the audit
        closes. Never raises: what cannot be written is logged with its count."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
            self._sweeper = None
        now = self.clock()
        due = self._roll(now, end=now)
        if not due:
            return
        if not await self._write(due, raise_errors=False):
            log.error(
                "%d auth failure(s) or refusal(s) were counted but their summary could not be written to the "
                "audit before exit (pvegate_unauthenticated_refusals_total has them)",
                self.pending(),
            )


def _parse(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
