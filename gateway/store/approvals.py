"""Approvals: pending requests, four-eyes votes and one-time, call-bound approval tokens.

Flow: the decision says an approval is required → `pending_result` records a
pending request (or returns the identical pending one) and answers the agent
with a not-executed result. Approvers vote through the admin API or the CLI;
whether *this* approver may vote on *this* request is asked of OPA
(data.pvegate.approver.decision) every time. When enough approvals are in, a
one-time token (256 random bits) is minted, shown once and stored only as its
SHA-256. The agent retries the same call with the token in
params._meta["pvegate/approval"]; `redeem` consumes it with one conditional
UPDATE bound to requester, tool, arguments digest, target and expiry, and hands
the approval's facts to OPA, which makes the final decision; a call refused before
anything was sent gives it back (`release`), so only a sent call spends it.

The store lives in the audit database file (tables approval_requests and
approval_votes), so one file holds the whole record, or in PostgreSQL when
storage.url says so (store/db.py); every state change is also written to the
audit chain.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.core import jsonread
from gateway.core.calls import CallRequest, CallResult
from gateway.core.canonical import canonical_json
from gateway.core.config import Config
from gateway.core.principal import Principal
from gateway.policy.decisions import CONTRACT_VERSION, Decision, DecisionClient
from gateway.store.approvals_schema import MIGRATIONS as MIGRATIONS  # re-exported: its tables, as data
from gateway.store.approvals_schema import POSTGRES_V1 as POSTGRES_V1
from gateway.store.approvals_schema import SQLITE_V1 as SQLITE_V1
from gateway.store.audit import CALL_SECRETS, AuditLog, AuditRecord, audit_arguments
from gateway.store.db import Database, SqliteDatabase, database
from gateway.store.migrations import check
from gateway.tools.tool import Tool

log = logging.getLogger("pvegate.approvals")

APPROVAL_META_KEY = "pvegate/approval"  # the one-time token an agent presents on its retry
# Set only by the transport, from a verified (HMAC-sealed, principal- and call-bound)
# requestState after a URL elicitation: the approval id to redeem without a token.
APPROVAL_REQUEST_META = "pvegate/approval_request"
APPROVAL_ID_META = "pvegate/approval_id"  # on a pending result: what the hand-off shows
APPROVAL_URL_META = "pvegate/approval_url"
WITHDRAWN_WHILE_HELD = "asked for while this call held the approval: ended, not given back"  # a release's record
TOKEN_BYTES = 32  # 256 bits
STATES = ("pending", "approved", "denied", "withdrawn", "expired", "used")
# how far back a sweep looks for expiries whose audit record is missing (UNRECORDED: at start, after a failure)
UNRECORDED_LOOKBACK_SECONDS = 7 * 86400
# how far from a supersession (older data: no request created with it) its record is looked for
SUPERSEDED_RECORD_WINDOW = 300.0
CLOSE_RECORD_SECONDS = 2.0  # at close: how long the releases still unrecorded are tried once more
MAX_UNRECORDED_RELEASES = 10_000  # releases whose record failed, kept for the next sweep (Approvals.release)
# decided_by of a pending request ended because the policy now asks other approvers, more of them or
# a shorter lifetime for its call (state 'expired'; the note names the request that replaces it)
POLICY_CHANGE = "policy change"
# a committed transition's record, written once whoever writes it (its own writer, a catch-up): the outcomes that
# are that record, and whether it is the principal's own (a vote: one per voter)
EXPIRED: tuple[tuple[str, ...], bool] = (("expired",), False)
VOTED: tuple[tuple[str, ...], bool] = (("approved", "denied"), True)
WITHDRAWN: tuple[tuple[str, ...], bool] = (("withdrawn",), False)
REQUESTED: tuple[tuple[str, ...], bool] = (("requested",), False)  # under the held call's request id
# under the superseding call's request id (naming the superseded request): a call supersedes one request at most,
# since find_or_replace leaves a call one live pending request (see pending_result for older data's several)
SUPERSEDED: tuple[tuple[str, ...], bool] = (("superseded",), False)
# under the releasing call's request id: a call holds one approval, and gives it back (or ends it) once
RELEASED: tuple[tuple[str, ...], bool] = (("released", "withdrawn"), False)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def target_key(target: dict[str, Any]) -> str:
    """What a token is bound to about the target: the cluster, node, guest and storage it names, and the
    guest's pool and tags; and, for a call decided on whose data it destroys or copies, that guest too:
    the guest a volume belongs to (target.volume_of), a backup was taken of (target.backup_of), the guests
    a prune deletes backups of (target.prune_removes), the guests a pool membership change moves
    (target.members). The approvers were checked against those (a scoped
    approver covers them: nodes, pools, guest tags) and an approval rule may select by tag; a retry that
    would reach others (the guest moved into another pool, the volume's guest replaced, another guest's
    backups now pruned) needs its own approval."""
    key: dict[str, Any] = {k: target.get(k) for k in ("cluster", "node", "vmid", "storage")}
    key.update(_placed(target))
    for field_name in ("volume_of", "backup_of"):
        owner = target.get(field_name)
        if isinstance(owner, dict):  # as the target's guest: id, node, pool and tags
            placed = _placed(owner)
            key[field_name] = [owner.get("vmid"), owner.get("node"), *([placed] if placed else [])]
    for list_name in ("prune_removes", "members"):  # the guests a prune or a pool membership change reaches
        reached = target.get(list_name)
        if isinstance(reached, dict):
            guests = [g for g in reached.get("guests") or [] if isinstance(g, dict)]
            key[list_name] = sorted(
                f"{g.get('vmid')}@{g.get('node')}" + (canonical_json(p) if (p := _placed(g)) else "") for g in guests
            )
    return canonical_json(key)


def _placed(guest: dict[str, Any]) -> dict[str, Any]:
    """A guest's pool and tags (as a set), only those it has: a guest in no pool and without tags keeps
    the key it had before these were bound, so its approvals pending across an upgrade stay valid."""
    out: dict[str, Any] = {}
    if guest.get("pool") is not None:
        out["pool"] = guest["pool"]
    tags = guest.get("tags")
    if isinstance(tags, list) and tags:
        out["tags"] = sorted({str(t) for t in tags})
    return out


@dataclass
class ApprovalRequest:
    id: str
    created_at: float
    request_id: str
    requester: str
    requester_facts: dict[str, Any]
    tool: str
    tool_facts: dict[str, Any]
    arguments_digest: str
    arguments: dict[str, Any]
    target_key: str
    target: dict[str, Any]
    risk: dict[str, Any]
    reason: str
    approver_groups: list[str]
    min_approvals: int
    ttl_seconds: int
    expires_at: float
    state: str
    decided_at: float | None = None
    decided_by: str | None = None
    note: str | None = None
    token_expires_at: float | None = None
    used_at: float | None = None
    used_by_request: str | None = None
    votes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ApprovalRequest:
        d = dict(row)
        d.pop("token_hash", None)  # never leaves the store
        for k in ("requester_facts", "tool_facts", "arguments", "target", "risk", "approver_groups"):
            d[k] = json.loads(d[k])
        return cls(**d)

    @property
    def approvals(self) -> list[dict[str, Any]]:
        return [v for v in self.votes if v["verdict"] == "approve"]

    def view(self) -> dict[str, Any]:
        """The request as shown to approvers and operators (arguments already redacted)."""
        return {
            "id": self.id,
            "state": self.state,
            "requester": self.requester,
            "tool": self.tool,
            "arguments": self.arguments,
            "arguments_digest": self.arguments_digest,
            "target": self.target,
            "risk": self.risk,
            "reason": self.reason,
            "approver_groups": self.approver_groups,
            "min_approvals": self.min_approvals,
            "approvals": [{"approver": v["approver"], "at": rfc3339(v["at"])} for v in self.approvals],
            "denials": [
                {"approver": v["approver"], "at": rfc3339(v["at"]), "note": v["note"]}
                for v in self.votes
                if v["verdict"] == "deny"
            ],
            "created_at": rfc3339(self.created_at),
            "expires_at": rfc3339(self.expires_at),
            "decided_at": rfc3339(self.decided_at) if self.decided_at else None,
            "decided_by": self.decided_by,
            "note": self.note,
            "token_expires_at": rfc3339(self.token_expires_at) if self.token_expires_at else None,
            "used_at": rfc3339(self.used_at) if self.used_at else None,
            "used_by_request": self.used_by_request,
        }

    def pending_input(self) -> dict[str, Any]:
        """The request as OPA sees it in an approver decision (input.pending)."""
        return {
            "id": self.id,
            "requester": self.requester,
            "tool": self.tool_facts,
            "arguments_digest": self.arguments_digest,
            "target": self.target,
            "risk": self.risk,
            "approver_groups": self.approver_groups,
            "min_approvals": self.min_approvals,
            "approvals_so_far": [{"approver": v["approver"], "approved_at": rfc3339(v["at"])} for v in self.approvals],
            "expires_at": rfc3339(self.expires_at),
        }


@dataclass
class VoteOutcome:
    ok: bool
    state: str | None = None
    token: str | None = None  # only on the vote that completed the approval; shown once
    reasons: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)  # stable codes of the reasons of a refusal
    approvals: int = 0
    needed: int = 0
    token_expires_at: float | None = None


@dataclass(frozen=True)
class Expiry:
    """An expired request, as its `approval` record `expired` tells it."""

    id: str
    requester: str
    tool: str
    target: dict[str, Any]
    was: str  # "approved" (an unused token ran out) or "pending" (no decision in time)
    until: float  # when it ran out

    @classmethod
    def of(
        cls, approval_id: str, requester: str, tool: str, target: dict[str, Any], expires_at: float, token_until: Any
    ) -> Expiry:
        # a token was minted (and ran out unused), or the request was still pending at its deadline
        if token_until is not None:
            return cls(approval_id, requester, tool, target, "approved", float(token_until))
        return cls(approval_id, requester, tool, target, "pending", float(expires_at))

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Expiry:
        return cls.of(
            str(row["id"]),
            str(row["requester"]),
            str(row["tool"]),
            json.loads(row["target"]),
            float(row["expires_at"]),
            row["token_expires_at"],
        )

    @classmethod
    def from_request(cls, req: ApprovalRequest) -> Expiry:
        return cls.of(req.id, req.requester, req.tool, req.target, req.expires_at, req.token_expires_at)


class NotFound(Exception):
    """No approval request with that id."""


class BadCursor(ValueError):
    """A paging cursor this store did not issue (or a damaged one)."""


MAX_PAGE = 500  # the most requests one page of the queue holds


def encode_cursor(rank: int, key: float, last_id: str) -> str:
    """The position after a page's last row, as an opaque URL-safe string."""
    raw = json.dumps([rank, key, last_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, float, str]:
    try:
        if len(cursor) > 400:
            raise ValueError("too long")
        doc = jsonread.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode())
        rank, key, last_id = doc
        if rank not in (0, 1) or isinstance(rank, bool) or isinstance(key, bool):
            raise ValueError("rank")
        if not isinstance(key, int | float) or not isinstance(last_id, str) or not math.isfinite(key):
            raise ValueError("types")
        return int(rank), float(key), last_id
    except (ValueError, TypeError, OverflowError) as exc:  # binascii.Error and JSONDecodeError are ValueErrors
        raise BadCursor("not a cursor of this queue (pass next_cursor as it was given)") from exc


def _terms(row: ApprovalRequest | dict[str, Any]) -> tuple[tuple[str, ...], int, int]:
    """What a pending request asks of its approvers: groups, minimum approvals, lifetime (seconds)."""
    if isinstance(row, ApprovalRequest):
        return tuple(sorted(row.approver_groups)), row.min_approvals, row.ttl_seconds
    groups = json.loads(str(row["approver_groups"]))
    return tuple(sorted(str(g) for g in groups)), int(row["min_approvals"]), int(row["ttl_seconds"])


def _terms_change(old: tuple[tuple[str, ...], int, int], new: tuple[tuple[str, ...], int, int]) -> str:
    def said(t: tuple[tuple[str, ...], int, int]) -> str:
        return f"{t[1]} approval(s) from {list(t[0])} within {t[2]} s"

    return f"what the call needs: {said(new)}, not {said(old)}"


def _voter_groups(votes: list[dict[str, Any]]) -> list[str]:
    groups: set[str] = set()
    for v in votes:
        try:
            facts = json.loads(v.get("approver_facts") or "{}")
        except ValueError:
            continue
        groups.update(g for g in facts.get("qualified_groups") or [] if isinstance(g, str))
    return sorted(groups)


# A used approval whose withdrawal was asked for while a call held it: `withdraw` cuts its token's
# expiry to the moment it was used, which no approval has otherwise (a token is consumed only
# before its expiry), so no column is needed for the mark.
WITHDRAWN_IN_USE = "(token_expires_at IS NOT NULL AND used_at IS NOT NULL AND token_expires_at <= used_at)"
# A request (alias r) superseded by find_or_replace: expired by a policy change while pending (no token: an approved
# request expiring keeps its voter as decided_by). One placeholder: POLICY_CHANGE.
SUPERSEDED_ROW = "(COALESCE(r.decided_by, '') = ? AND r.token_expires_at IS NULL)"


def _names(body: Any, approval_id: str) -> bool:
    """Whether a `superseded` record's body is about `approval_id` (its bodies name the new request too)."""
    try:
        doc = json.loads(str(body))
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("approval_id") == approval_id


class ApprovalStore:
    """The approval tables, on SQLite (in the audit database file, as before) or PostgreSQL.

    Every rule that must hold across replicas is one statement or one locked transaction in the
    database: a token is consumed by one conditional UPDATE (a concurrent one waits for the row
    and then no longer matches), votes lock their request's row, and identical pending requests
    are created under a lock on what makes them identical.
    """

    def __init__(self, where: Path | Database) -> None:
        self.database: Database = SqliteDatabase(where) if isinstance(where, Path) else where

    async def open(self) -> None:
        await self.database.open()
        try:
            await check(self.database, "approvals", MIGRATIONS)
        except BaseException:
            await self.database.close()
            raise

    async def close(self) -> None:
        await self.database.close()

    async def now(self) -> float:
        """The database's clock, the one every expiry is set and checked on (SQLite: this host's)."""
        return await self.database.now()

    async def expire_due(self, now: float | None = None) -> list[str]:
        """Mark pending requests and unused tokens past their expiry as expired (rows are kept): their ids.
        `now`: the database's clock unless given (tests)."""
        return [e.id for e in await self.expire_due_rows(now)]

    async def expire_due_rows(self, now: float | None = None) -> list[Expiry]:
        """`expire_due`, with what each expiry's audit record needs, in one conditional UPDATE: it reads the due
        rows and expires them at once, so no row is read twice, and each is expired (and returned) by one sweep
        only. On PostgreSQL a sweep that finds a row locked (a vote, another replica's sweep) waits and tests
        the row as committed again: a request approved meanwhile, or already expired, is left as it is."""
        async with self.database.transaction() as tx:
            now = await tx.now() if now is None else now
            rows = await tx.fetch(
                "UPDATE approval_requests SET state = 'expired', decided_at = COALESCE(decided_at, ?) "
                "WHERE (state = 'pending' AND expires_at <= ?) OR (state = 'approved' AND token_expires_at <= ?) "
                "RETURNING id, requester, tool, target, expires_at, token_expires_at",
                now,
                now,
                now,
            )
        found = [Expiry.from_row(r) for r in rows]
        return sorted(found, key=lambda e: (e.until, e.id))  # RETURNING's order is unspecified

    async def unrecorded_expiries(self, since: float) -> list[str]:
        """Requests expired since `since` (the gateway's clock) whose `approval` record `expired` the audit
        lacks: the sweep that expired them stopped before writing it (the audit refused writes, or the
        process died). The audit lives in the same database (SQLite file or PostgreSQL), so one query. A request
        superseded after a policy change is no expiry: its record is `superseded` (unrecorded_supersessions)."""
        rows = await self.database.fetch(
            "SELECT id FROM approval_requests r WHERE r.state = 'expired' AND r.decided_at >= ? "  # noqa: S608
            f"AND NOT {SUPERSEDED_ROW} AND NOT EXISTS "
            "(SELECT 1 FROM audit a WHERE a.request_id = r.id AND a.kind = 'approval' AND a.outcome = 'expired')",
            since,
            POLICY_CHANGE,
        )
        return [str(r["id"]) for r in rows]

    async def unrecorded_supersessions(self, since: float) -> list[dict[str, Any]]:
        """Requests superseded (find_or_replace) since `since` whose `approval` record `superseded` the audit lacks:
        the supersession was committed, then its record failed or the process died. That record is under the
        superseding call's request id, naming the request in its body: the call is found as the request it created
        in the same transaction (its call, and created_at equal to the supersession's decided_at: one clock
        reading); its `superseded` records are read and matched here. A request `expired` on record (what a
        catch-up wrote for a supersession before) is recorded too. Each: id, requester, tool, target, note,
        decided_at, new_id and by_call (the superseding request and its call; None if none was created then)."""
        rows = await self.database.fetch(
            "SELECT r.id, r.requester, r.tool, r.target, r.note, r.decided_at, "  # noqa: S608 - fixed text
            "n.id AS new_id, n.request_id AS by_call "
            "FROM approval_requests r LEFT JOIN approval_requests n ON n.requester = r.requester AND n.tool = r.tool "
            "AND n.arguments_digest = r.arguments_digest AND n.target_key = r.target_key "
            "AND n.created_at = r.decided_at AND n.id <> r.id "
            f"WHERE r.state = 'expired' AND r.decided_at >= ? AND {SUPERSEDED_ROW} AND NOT EXISTS "
            "(SELECT 1 FROM audit a WHERE a.request_id = r.id AND a.kind = 'approval' "
            "AND a.outcome IN ('expired', 'superseded')) ORDER BY r.decided_at, r.id",
            since,
            POLICY_CHANGE,
        )
        missing: list[dict[str, Any]] = []
        for row in rows:
            if row["by_call"] is not None:
                found = await self.database.fetch(
                    "SELECT body FROM audit WHERE request_id = ? AND kind = 'approval' AND outcome = 'superseded'",
                    row["by_call"],
                )
            else:  # no request was created then (older data): the call is unknown, so look at the records written
                # right after the supersession (by time: the audit_ts index, never the whole audit)
                at = float(row["decided_at"])
                found = await self.database.fetch(
                    "SELECT body FROM audit WHERE ts >= ? AND ts <= ? AND kind = 'approval' "
                    "AND outcome = 'superseded' AND body LIKE ?",
                    at - SUPERSEDED_RECORD_WINDOW,
                    at + SUPERSEDED_RECORD_WINDOW,
                    f"%{row['id']}%",
                )
            if not any(_names(r["body"], str(row["id"])) for r in found):
                missing.append(row)
        return missing

    async def unrecorded_votes(self, since: float) -> list[dict[str, Any]]:
        """Votes cast since `since` whose `approval` record (`approved` or `denied`, by the voter) the audit
        lacks: the vote was committed, then its record failed (the audit refusing writes: on PostgreSQL, the
        chain's head held past its lock timeout) or the process died in between."""
        return await self.database.fetch(
            "SELECT v.request_id, v.approver, v.verdict, v.at FROM approval_votes v WHERE v.at >= ? AND NOT EXISTS "
            "(SELECT 1 FROM audit a WHERE a.request_id = v.request_id AND a.kind = 'approval' "
            "AND a.principal = v.approver AND a.outcome IN ('approved', 'denied'))",
            since,
        )

    async def unrecorded_withdrawals(self, since: float) -> list[dict[str, Any]]:
        """Requests withdrawn (by `withdraw`) since `since` whose `approval` record `withdrawn` the audit lacks: the
        withdrawal was committed, then its record failed or the process died. One withdrawn by `release` (asked for
        while a call held it: used_at kept) has its record under that call's request id, so it is not one."""
        return await self.database.fetch(
            "SELECT id, decided_by, decided_at, note FROM approval_requests r WHERE r.state = 'withdrawn' "
            "AND r.used_at IS NULL AND r.decided_at >= ? AND NOT EXISTS (SELECT 1 FROM audit a "
            "WHERE a.request_id = r.id AND a.kind = 'approval' AND a.outcome = 'withdrawn')",
            since,
        )

    async def unrecorded_ended_releases(self, since: float) -> list[dict[str, Any]]:
        """Approvals a call's `release` ended withdrawn since `since` (their withdrawal was asked for while the call
        held them: the row keeps its holder) whose `approval` record `withdrawn`, under that call's request id, the
        audit lacks: the release was committed, then its record failed or the process died. A plain give-back
        leaves no such trace (Approvals.release keeps those in memory)."""
        return await self.database.fetch(
            "SELECT id, requester, tool, target, decided_at, used_by_request FROM approval_requests r "
            "WHERE r.state = 'withdrawn' AND r.used_by_request IS NOT NULL AND r.decided_at >= ? AND NOT EXISTS "
            "(SELECT 1 FROM audit a WHERE a.request_id = r.used_by_request AND a.kind = 'approval' "
            "AND a.outcome = 'withdrawn')",
            since,
        )

    async def unrecorded_requests(self, since: float) -> list[str]:
        """Requests created since `since` whose `approval` record `requested` (under the held call's request id,
        which made one request at most) the audit lacks: the request was committed, then its record failed or the
        process died, so approvers could vote on a request the audit never mentioned."""
        rows = await self.database.fetch(
            "SELECT id FROM approval_requests r WHERE r.created_at >= ? AND NOT EXISTS (SELECT 1 FROM audit a "
            "WHERE a.request_id = r.request_id AND a.kind = 'approval' AND a.outcome = 'requested') "
            "ORDER BY created_at",
            since,
        )
        return [str(r["id"]) for r in rows]

    async def get(self, request_id: str) -> ApprovalRequest:
        rows = await self.database.fetch("SELECT * FROM approval_requests WHERE id = ?", request_id)
        if not rows:
            raise NotFound(request_id)
        req = ApprovalRequest.from_row(rows[0])
        req.votes = await self.database.fetch(
            "SELECT approver, approver_facts, verdict, at, note, opa_decision_id FROM approval_votes "
            "WHERE request_id = ? ORDER BY at",
            request_id,
        )
        return req

    async def state_counts(self) -> dict[str, int]:
        rows = await self.database.fetch("SELECT state, COUNT(*) AS n FROM approval_requests GROUP BY state")
        return {str(r["state"]): int(r["n"]) for r in rows}

    async def page(
        self, states: Sequence[str] | None = ("pending",), limit: int = 200, cursor: str | None = None
    ) -> tuple[list[ApprovalRequest], str | None]:
        """One page of the requests in `states` (None: every state) and the cursor of the next page
        (None: this is the last). The state filter is SQL's, so no other state's rows crowd a page.

        Order: pending requests first, the one expiring soonest first (the one an approver must see
        before it is gone), then every other request newest first; the id breaks ties. A cursor is
        the position after a page's last row (keyset paging): requests created meanwhile never shift
        a pending one out of reach, since a live pending request keeps its place (its expiry) until
        it leaves the state."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be 1..{MAX_PAGE}")
        after = decode_cursor(cursor) if cursor else None
        inner = (
            "SELECT id, CASE WHEN state = 'pending' THEN 0 ELSE 1 END AS rk, "
            "CASE WHEN state = 'pending' THEN expires_at ELSE -created_at END AS k FROM approval_requests"
        )
        args: list[Any] = []
        if states:
            inner += f" WHERE state IN ({', '.join('?' for _ in states)})"
            args += list(states)
        sql = f"SELECT id, rk, k FROM ({inner}) AS q"  # noqa: S608 - fixed text and placeholders
        if after is not None:
            rk, k, last = after
            sql += " WHERE rk > ? OR (rk = ? AND (k > ? OR (k = ? AND id > ?)))"
            args += [rk, rk, k, k, last]
        sql += " ORDER BY rk, k, id LIMIT ?"
        rows = await self.database.fetch(sql, *args, limit + 1)
        more, rows = len(rows) > limit, rows[:limit]
        items = [await self.get(str(r["id"])) for r in rows]
        nxt = encode_cursor(int(rows[-1]["rk"]), float(rows[-1]["k"]), str(rows[-1]["id"])) if more else None
        return items, nxt

    async def list(self, state: str | None = "pending", limit: int = 200) -> list[ApprovalRequest]:
        """The first page of `state` (None: every state), in the queue's order (see `page`)."""
        items, _ = await self.page([state] if state else None, limit)
        return items

    async def find_or_create(self, req: ApprovalRequest) -> tuple[ApprovalRequest, bool]:
        """`find_or_replace` without the superseded requests: (request, created)."""
        found, created, _ = await self.find_or_replace(req)
        return found, created

    async def find_or_replace(self, req: ApprovalRequest) -> tuple[ApprovalRequest, bool, Sequence[tuple[str, str]]]:
        """The identical live pending request if there is one, else `req` inserted: (request, created,
        superseded). Identical is the same call (requester, tool, digest, target) on the same terms
        (approver groups, minimum approvals, lifetime): a live pending request of the same call on other
        terms was created under another policy, so its approvers are not the ones asked for now; it
        is ended (expired, decided_by POLICY_CHANGE, the note saying why: `superseded`, (id, note)
        each) and can no longer be voted on or redeemed. Its created_at and expires_at are set on the
        database's clock, as every expiry check is."""
        superseded: list[tuple[str, str]] = []
        async with self.database.transaction() as tx:
            await tx.lock(f"approval:{req.requester}|{req.tool}|{req.arguments_digest}|{req.target_key}")
            now = await tx.now()
            req.created_at, req.expires_at = now, now + req.ttl_seconds
            live = await tx.fetch(
                "SELECT id, approver_groups, min_approvals, ttl_seconds FROM approval_requests "
                "WHERE requester = ? AND tool = ? AND arguments_digest = ? "
                "AND target_key = ? AND state = 'pending' AND expires_at > ? ORDER BY created_at",
                req.requester,
                req.tool,
                req.arguments_digest,
                req.target_key,
                now,
            )
            rows = [r for r in live if _terms(r) == _terms(req)][:1]
            for r in live:
                if _terms(r) == _terms(req):
                    continue
                note = f"superseded by {rows[0]['id'] if rows else req.id}: the policy changed " + _terms_change(
                    _terms(r), _terms(req)
                )
                ended = await tx.execute(
                    "UPDATE approval_requests SET state = 'expired', decided_at = ?, decided_by = ?, note = ? "
                    "WHERE id = ? AND state = 'pending'",
                    now,
                    POLICY_CHANGE,
                    note,
                    str(r["id"]),
                )
                # on PostgreSQL the UPDATE may have waited for a vote or sweep that ended it first (approved,
                # denied, expired): that request was not superseded, and no record may say it was
                if ended == 1:
                    superseded.append((str(r["id"]), note))
            if not rows:
                await tx.execute(
                    "INSERT INTO approval_requests (id, created_at, request_id, requester, requester_facts, tool, "
                    "tool_facts, arguments_digest, arguments, target_key, target, risk, reason, approver_groups, "
                    "min_approvals, ttl_seconds, expires_at, state) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    req.id,
                    req.created_at,
                    req.request_id,
                    req.requester,
                    canonical_json(req.requester_facts),
                    req.tool,
                    canonical_json(req.tool_facts),
                    req.arguments_digest,
                    canonical_json(req.arguments),
                    req.target_key,
                    canonical_json(req.target),
                    canonical_json(req.risk),
                    req.reason,
                    canonical_json(req.approver_groups),
                    req.min_approvals,
                    req.ttl_seconds,
                    req.expires_at,
                    "pending",
                )
        if not rows:
            return await self.get(req.id), True, superseded
        return await self.get(str(rows[0]["id"])), False, superseded

    async def vote(
        self,
        request_id: str,
        approver: Principal,
        verdict: str,
        decision_id: str | None,
        note: str | None,
        qualified_groups: Sequence[str] = (),
    ) -> VoteOutcome:
        """Record an OPA-approved vote; completes the request when enough approvals are in."""
        token: str | None = None
        async with self.database.transaction() as tx:
            now = await tx.now()  # one clock for every replica: the database's
            # FOR UPDATE on PostgreSQL: concurrent votes on this request take turns, each sees the ones before
            sql = "SELECT state, expires_at, min_approvals, ttl_seconds FROM approval_requests WHERE id = ?"
            rows = await tx.fetch(sql + tx.for_update, request_id)
            if not rows:
                raise NotFound(request_id)
            row = rows[0]
            state, expires_at = str(row["state"]), float(row["expires_at"])
            needed, ttl = int(row["min_approvals"]), int(row["ttl_seconds"])
            if state != "pending" or expires_at <= now:
                word = "expired" if state == "pending" else state
                return VoteOutcome(False, state, reasons=[f"request {request_id} is {word}"])
            added = await tx.execute(
                "INSERT INTO approval_votes (request_id, approver, approver_facts, verdict, at, opa_decision_id, "
                "note) VALUES (?,?,?,?,?,?,?) ON CONFLICT (request_id, approver) DO NOTHING",
                request_id,
                approver.sub,
                canonical_json({**approver.as_input(), "qualified_groups": list(qualified_groups)}),
                verdict,
                now,
                decision_id,
                note,
            )
            if added != 1:
                return VoteOutcome(False, state, reasons=[f"{approver.sub} has already voted on {request_id}"])
            counted = await tx.fetch(
                "SELECT COUNT(*) AS n FROM approval_votes WHERE request_id = ? AND verdict = 'approve'", request_id
            )
            approvals = int(counted[0]["n"]) if counted else 0
            if verdict == "deny":
                state = "denied"
                await tx.execute(
                    "UPDATE approval_requests SET state = 'denied', decided_at = ?, decided_by = ?, note = ? "
                    "WHERE id = ?",
                    now,
                    approver.sub,
                    note,
                    request_id,
                )
            elif approvals >= needed:
                state = "approved"
                token = secrets.token_urlsafe(TOKEN_BYTES)
                await tx.execute(
                    "UPDATE approval_requests SET state = 'approved', decided_at = ?, decided_by = ?, note = ?, "
                    "token_hash = ?, token_expires_at = ? WHERE id = ?",
                    now,
                    approver.sub,
                    note,
                    token_hash(token),
                    now + ttl,
                    request_id,
                )
        return VoteOutcome(
            True, state, token, approvals=approvals, needed=needed, token_expires_at=now + ttl if token else None
        )

    async def withdraw(self, request_id: str, by: str, note: str | None) -> VoteOutcome:
        """Withdraw a pending request or an unused approval. An approval a call holds (`used`) is too
        late to withdraw, since that call may already be running, but it must not come back either:
        its token's expiry is cut to the moment it was used (WITHDRAWN_IN_USE), so if the call is refused
        before anything is sent, `release` ends it as withdrawn instead of giving it back."""
        async with self.database.transaction() as tx:
            now = await tx.now()
            changed = await tx.execute(
                "UPDATE approval_requests SET state = 'withdrawn', decided_at = ?, decided_by = ?, note = ? "
                "WHERE id = ? AND state IN ('pending', 'approved')",
                now,
                by,
                note,
                request_id,
            )
            held = 0
            if changed != 1:
                held = await tx.execute(
                    f"UPDATE approval_requests SET token_expires_at = used_at WHERE id = ? AND state = 'used' "  # noqa: S608
                    f"AND NOT {WITHDRAWN_IN_USE}",
                    request_id,
                )
        if changed == 1:
            return VoteOutcome(True, "withdrawn")
        req = await self.get(request_id)
        if req.state == "used":
            already = "" if held else " (a withdrawal was already asked for)"
            return VoteOutcome(
                False,
                req.state,
                reasons=[
                    f"request {request_id} is in use by request {req.used_by_request}, which may already be running: "
                    "too late to stop it; if it is refused before anything is sent, the approval ends withdrawn "
                    f"instead of being given back{already}"
                ],
            )
        return VoteOutcome(False, req.state, reasons=[f"request {request_id} is {req.state}; nothing to withdraw"])

    async def consume(
        self, key: str, column: str, principal: str, tool: str, digest: str, tkey: str, used_by: str
    ) -> tuple[ApprovalRequest | None, str | None]:
        """Use an approval once, found by token hash (or by id, for a verified requestState):
        one conditional UPDATE that matches only a live, unused approval for exactly this
        requester, tool, arguments and target. (request, None) or (None, why not)."""
        if column not in ("token_hash", "id"):
            raise ValueError(column)
        async with self.database.transaction() as tx:  # the conditional UPDATE is the whole consumption
            now = await tx.now()  # expiry on the database's clock: replicas with skewed clocks agree
            changed = await tx.execute(
                "UPDATE approval_requests SET state = 'used', used_at = ?, used_by_request = ? "  # noqa: S608
                f"WHERE {column} = ? AND state = 'approved' AND used_at IS NULL AND token_expires_at > ? "
                "AND requester = ? AND tool = ? AND arguments_digest = ? AND target_key = ?",
                now,
                used_by,
                key,
                now,
                principal,
                tool,
                digest,
                tkey,
            )
            rows = await tx.fetch(f"SELECT id FROM approval_requests WHERE {column} = ?", key)  # noqa: S608
        if not rows:
            return None, "the approval token is not known to this gateway (mistyped, or never issued)"
        req = await self.get(str(rows[0]["id"]))
        if changed == 1:
            return req, None
        return None, _why_not(req, principal, tool, digest, tkey, now)

    async def release(self, approval_id: str, used_by: str) -> str | None:
        """Give back an approval that request `used_by` consumed and then sent nothing with (refused by
        the policy, a quota, the store, the runtime): 'approved' again, as it was. Only the request that
        holds it can, and only while it holds it, so a token still runs at most once. An approval whose
        withdrawal was asked for while the call held it ends 'withdrawn' instead. Returns the state it
        left the approval in ('approved' or 'withdrawn'), or None when this request did not hold it."""
        async with self.database.transaction() as tx:
            given = await tx.execute(
                "UPDATE approval_requests SET state = 'approved', used_at = NULL, used_by_request = NULL "  # noqa: S608
                f"WHERE id = ? AND state = 'used' AND used_by_request = ? AND NOT {WITHDRAWN_IN_USE}",
                approval_id,
                used_by,
            )
            if given:
                return "approved"
            ended = await tx.execute(
                "UPDATE approval_requests SET state = 'withdrawn', decided_at = ? "  # noqa: S608
                f"WHERE id = ? AND state = 'used' AND used_by_request = ? AND {WITHDRAWN_IN_USE}",
                await tx.now(),
                approval_id,
                used_by,
            )
        return "withdrawn" if ended else None


def _audit_target(target: dict[str, Any] | None) -> str | None:
    """The audit's target key, as the pipeline writes it (cluster/type/vmid, cluster/node/name, cluster)."""
    if not target:
        return None
    if target.get("vmid") is not None:
        return f"{target.get('cluster')}/{target.get('type') or 'guest'}/{target['vmid']}"
    if target.get("node"):
        return f"{target.get('cluster')}/node/{target['node']}"
    return str(target.get("cluster")) if target.get("cluster") else None


def _tdesc(target: dict[str, Any]) -> str:
    return "/".join(str(target.get(k)) for k in ("cluster", "node", "vmid") if target.get(k) is not None)


def _why_not(req: ApprovalRequest, principal: str, tool: str, digest: str, tkey: str, now: float) -> str:
    rid = req.id
    if req.state == "used":
        return f"approval {rid} was already used by request {req.used_by_request}; a token works only once"
    if req.state == "pending":
        return f"approval request {rid} is still pending ({len(req.approvals)}/{req.min_approvals} approvals)"
    if req.state == "denied":
        return f"approval request {rid} was denied by {req.decided_by}"
    if req.state == "withdrawn" and req.used_at is not None:  # asked for while a call held it (WITHDRAWN_IN_USE)
        return f"approval {rid} was withdrawn while request {req.used_by_request} held it"
    if req.state == "withdrawn":
        return f"approval {rid} was withdrawn by {req.decided_by}"
    if req.state == "expired" and req.decided_by == POLICY_CHANGE:
        return f"approval request {rid} was {req.note}; retry without it to request a new approval"
    if req.state == "expired" or (req.token_expires_at is not None and req.token_expires_at <= now):
        return f"approval {rid} expired at {rfc3339(req.token_expires_at or req.expires_at)}"
    if req.requester != principal:
        return f"approval {rid} was granted to another principal, not {principal}"
    if req.tool != tool:
        return f"approval {rid} was granted for tool {req.tool}, not {tool}"
    if req.target_key != tkey:
        return f"approval {rid} was granted for another target ({_tdesc(req.target)})"
    if req.arguments_digest != digest:
        return f"approval {rid} was granted for other arguments ({req.arguments_digest})"
    return f"approval {rid} is {req.state} and cannot be used"


class Approvals:
    """The gateway's side of approvals: pending results, redemption, and approver votes.

    Constructed without a store it is the fail-closed placeholder: calls that need
    an approval are refused and presented tokens are rejected.
    """

    def __init__(
        self,
        store: ApprovalStore | None = None,
        audit: AuditLog | None = None,
        decisions: DecisionClient | None = None,
        page_base: str | None = None,
        config_path: str | None = None,
        opa_note: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.audit = audit
        self.decisions = decisions
        self.page_base = page_base.rstrip("/") if page_base else None
        self.config_path = config_path
        # which OPA decides votes when it is not the gateway's configured one (the CLI's --opa-url): on each
        # vote's record, so a policy picked by hand is on record
        self.opa_note = opa_note
        # look for expiries whose record is missing at the next sweep: at start (the last run may have died
        # between the two), and after a sweep whose records could not all be written
        self._unrecorded = True
        # releases committed by this process whose record failed, written by the next sweep. A give-back
        # leaves no trace on the approval's row, and finding one from the audit's `consumed` records means
        # reading the audit by time (millions of rows, holding the approvals database meanwhile): so only
        # this process knows them, and one that dies between a release and its record leaves it unrecorded
        # (docs/approvals.md). Bounded: a store failing for long keeps the newest.
        self._unrecorded_releases: dict[str, dict[str, Any]] = {}

    # --- the agent side --------------------------------------------------------------

    async def redeem(
        self,
        meta: dict[str, Any],
        principal: Principal,
        tool: str,
        digest: str,
        target: dict[str, Any],
        request_id: str = "",
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(approval facts for OPA, or None; refusal reason, or None)."""
        token = meta.get(APPROVAL_META_KEY)
        by_id = meta.get(APPROVAL_REQUEST_META)
        if token is None and by_id is None:
            return None, None
        if self.store is None:
            return None, "approval tokens are not accepted by this gateway (approvals are not enabled)"
        if token is not None:
            if not isinstance(token, str) or not 16 <= len(token) <= 256:
                return None, (
                    f'the approval token in _meta["{APPROVAL_META_KEY}"] is malformed (expected the token string '
                    "the approval gave, 16 to 256 characters)"
                )
            key, column = token_hash(token), "token_hash"
        else:
            key, column = str(by_id), "id"
        req, why = await self.store.consume(key, column, principal.sub, tool, digest, target_key(target), request_id)
        if req is None:
            return None, f"approval refused: {why}"
        await self._audit(
            request_id or req.id, "approval", principal.sub, req.tool, "consumed", {"approval_id": req.id}, req.target
        )
        return self.facts(req), None

    async def release(
        self, approval_id: str, principal: Principal, tool: str, target: dict[str, Any], request_id: str, why: str
    ) -> bool:
        """Give back the approval request `request_id` consumed, when the call was refused before
        anything was sent: the retry the refusal asks for may present it again. Audited as `released`
        (the `consumed` record's counterpart). A crash before this leaves it used: refused, never run twice."""
        state = None if self.store is None else await self.store.release(approval_id, request_id)
        if state is None:
            return False
        body: dict[str, Any] = {"approval_id": approval_id, "why": why}
        if state == "withdrawn":  # its withdrawal was asked for while this call held it
            body["withdrawn"] = WITHDRAWN_WHILE_HELD
        outcome = "released" if state == "approved" else state
        try:  # appended only if absent (RELEASED): the retry below may meet a record written after all
            await self._audit(request_id, "approval", principal.sub, tool, outcome, body, target, RELEASED)
        except BaseException:
            # a committed release without its record: the next sweep writes it
            late = {
                **body,
                "released_at": rfc3339(time.time()),  # a retry's `consumed` may be recorded before this does
                "recorded_late": "the approval was released, its record could not be written then",
            }
            pending = self._unrecorded_releases
            pending[request_id] = {
                "who": principal.sub,
                "tool": tool,
                "outcome": outcome,
                "body": late,
                "target": target,
            }
            while len(pending) > MAX_UNRECORDED_RELEASES:
                dropped = next(iter(pending))
                log.error("approval release of request %s dropped unrecorded: too many waiting", dropped)
                del pending[dropped]
            self._unrecorded = True
            raise
        return state == "approved"

    async def waiting(
        self, meta: dict[str, Any], principal: Principal, tool: str, digest: str, target: dict[str, Any]
    ) -> ApprovalRequest | None:
        """The approval a verified retry names (requestState, or the legacy handoff), when it is still
        pending for exactly this call: the agent retried before the approver voted. That is an
        answer of "still held", not a refusal, and the retry handle must not be lost with it."""
        by_id = meta.get(APPROVAL_REQUEST_META)
        if self.store is None or by_id is None or meta.get(APPROVAL_META_KEY) is not None:
            return None
        try:
            req = await self.store.get(str(by_id))
        except NotFound:
            return None
        same = (req.requester, req.tool, req.arguments_digest, req.target_key) == (
            principal.sub,
            tool,
            digest,
            target_key(target),
        )
        if not same or req.state != "pending":
            return None
        # the database's clock, as the expiry was set: a replica whose own clock lags must not hold a request
        # no approver can vote on any more, nor one whose clock leads refuse a live one
        return req if req.expires_at > await self.store.now() else None

    @staticmethod
    def facts(req: ApprovalRequest) -> dict[str, Any]:
        """input.approval: the facts of a verified, consumed approval (the policy decides with them)."""
        return {
            "id": req.id,
            "approvers": [v["approver"] for v in req.approvals],
            # the groups the approving voters belonged to when OPA let them vote, not the
            # groups the request asked for: the policy checks them against what it requires now
            "approver_groups": _voter_groups(req.approvals),
            "approved_at": rfc3339(req.decided_at or time.time()),
            "tool": req.tool,
            "arguments_digest": req.arguments_digest,
            "target": {k: req.target.get(k) for k in ("cluster", "node", "vmid")},
            "requester": req.requester,
            "expires_at": rfc3339(req.token_expires_at or req.expires_at),
        }

    async def pending_result(
        self,
        req: CallRequest,
        tool: Tool,
        args: dict[str, Any],
        digest: str,
        target: dict[str, Any],
        decision: Decision,
    ) -> CallResult:
        reason = decision.approval.get("reason") or "policy requires a human approval"
        if self.store is None:
            return CallResult("denied", f"Denied: {reason}; approvals are not enabled on this gateway", is_error=True)
        await self.expire_due()
        ttl = int(decision.approval.get("ttl_seconds") or 900)
        now = time.time()
        candidate = ApprovalRequest(
            id="apr-" + uuid.uuid4().hex,
            created_at=now,
            request_id=req.request_id,
            requester=req.principal.sub,
            requester_facts=req.principal.as_input(),
            tool=tool.name,
            tool_facts=tool.policy_view,
            arguments_digest=digest,
            arguments=audit_arguments(tool, args, decision.obligations.get("redact")),
            target_key=target_key(target),
            target=target,
            risk=decision.risk,
            reason=reason,
            approver_groups=list(decision.approval.get("approver_groups") or []),
            min_approvals=max(1, int(decision.approval.get("min_approvals") or 1)),
            ttl_seconds=ttl,
            expires_at=now + ttl,
            state="pending",
        )
        pending, created, superseded = await self.store.find_or_replace(candidate)
        # a replica's catch-up may write a supersession's record too (unrecorded_supersessions): under this call's
        # id, so of the two one writes it. Several superseded at once (only from data older than find_or_replace:
        # it leaves a call one live request) are appended as before, since `once` tells them apart by call only.
        once = SUPERSEDED if created and len(superseded) == 1 else None
        try:
            for old_id, note in superseded:  # held under an older policy: its approvers are not the ones asked now
                await self._audit(
                    req.request_id,
                    "approval",
                    req.principal.sub,
                    tool.name,
                    "superseded",
                    {"approval_id": old_id, "superseded_by": pending.id, "note": note},
                    target,
                    once,
                )
            await self._audit(
                req.request_id,
                "approval",
                req.principal.sub,
                tool.name,
                "requested" if created else "pending_reused",
                {
                    "approval_id": pending.id,
                    "expires_at": rfc3339(pending.expires_at),
                    "reason": reason,
                    "codes": decision.approval_codes,
                },
                target,
                REQUESTED if created else None,
            )
        except BaseException:
            # a committed request without its record: the next sweep writes it (and a superseded one's, `superseded`)
            self._unrecorded = self._unrecorded or created or bool(superseded)
            raise
        return self.held(pending, tool.name, reason, decision.approval_codes)

    def held(self, pending: ApprovalRequest, tool: str, reason: str, codes: list[str]) -> CallResult:
        """The answer to a call held for `pending`: how a human approves it, and how to retry."""
        how = self.how_to_approve(pending.id)
        text = (
            f"Not executed: {tool} needs a human approval ({reason}). "
            f"Approval request {pending.id} is pending until {rfc3339(pending.expires_at)}; "
            f"it needs {pending.min_approvals} approval(s) from {', '.join(pending.approver_groups) or 'an approver'}. "
            f"A human approves it at {how['url'] or '(admin API not enabled)'} or with `{how['cli']}`. "
            f"The approver receives a one-time token; retry exactly the same call with it in "
            f'params._meta["{APPROVAL_META_KEY}"].'
        )
        structured = {
            "executed": False,
            "approval": {
                "id": pending.id,
                "status": "pending",
                "reason": reason,
                "codes": codes,
                "expires_at": rfc3339(pending.expires_at),
                "approver_groups": pending.approver_groups,
                "min_approvals": pending.min_approvals,
                "approvals": len(pending.approvals),
                "approve_url": how["url"],
                "approve_cli": how["cli"],
                "retry_meta_key": APPROVAL_META_KEY,
            },
        }
        return CallResult(
            "pending_approval",
            text,
            structured=structured,
            is_error=True,
            meta={APPROVAL_ID_META: pending.id, **({APPROVAL_URL_META: how["url"]} if how["url"] else {})},
        )

    def how_to_approve(self, approval_id: str) -> dict[str, str | None]:
        cfg = f" --config {self.config_path}" if self.config_path else ""
        return {
            "url": f"{self.page_base}/admin/approvals/{approval_id}" if self.page_base else None,
            "cli": f"pvegate approvals approve {approval_id}{cfg}",
        }

    # --- the approver side --------------------------------------------------------------

    async def decide(
        self,
        approval_id: str,
        approver: Principal,
        verdict: str,
        note: str | None = None,
        *,
        auth_time: float | None = None,
        via: str = "bearer",
        source_ip: str | None = None,
    ) -> VoteOutcome:
        """An approver approves or denies; OPA says whether this approver may, every time.

        `auth_time`: when the approver last authenticated (the policy's step-up compares it);
        `source_ip`: where the vote came from (the same fact the console's "may you vote" asks with)."""
        if self.store is None or self.decisions is None:
            return VoteOutcome(False, reasons=["approvals are not enabled on this gateway"])
        if verdict not in ("approve", "deny"):
            return VoteOutcome(False, reasons=[f"unknown verdict {verdict!r}"])
        await self.expire_due()
        req = await self.store.get(approval_id)  # NotFound propagates
        if req.state != "pending":
            out = VoteOutcome(False, req.state, reasons=[f"request {approval_id} is {req.state}"])
        else:
            verdict_ = await self.decisions.may_approve(
                approve_input(req, approver, verdict, source_ip, auth_time=auth_time, via=via)
            )
            if not verdict_.allowed:
                out = VoteOutcome(
                    False,
                    req.state,
                    reasons=verdict_.reasons or ["denied by the approver policy"],
                    codes=list(verdict_.codes),
                )
            else:
                out = await self.store.vote(approval_id, approver, verdict, verdict_.decision_id, note, verdict_.groups)
        body: dict[str, Any] = {
            "approval_id": approval_id,
            "verdict": verdict,
            "ok": out.ok,
            "reasons": out.reasons,
            "codes": out.codes,
            "via": via,
        }
        if out.ok:
            body.update(state=out.state, approvals=out.approvals, needed=out.needed, token_minted=out.token is not None)
        if self.opa_note is not None:
            body["opa"] = self.opa_note
        outcome = {"approve": "approved", "deny": "denied"}[verdict] if out.ok else f"{verdict}_refused"
        try:  # a committed vote's record: a replica's catch-up may be writing it too (VOTED)
            once = VOTED if out.ok else None
            await self._audit(approval_id, "approval", approver.sub, req.tool, outcome, body, req.target, once)
        except BaseException:
            self._unrecorded = True  # a committed vote without its record: the next sweep writes it
            raise
        return out

    async def withdraw(self, approval_id: str, by: str, note: str | None = None) -> VoteOutcome:
        if self.store is None:
            return VoteOutcome(False, reasons=["approvals are not enabled on this gateway"])
        req = await self.store.get(approval_id)
        out = await self.store.withdraw(approval_id, by, note)
        try:
            await self._audit(
                approval_id,
                "approval",
                by,
                req.tool,
                "withdrawn" if out.ok else "withdraw_refused",
                {"approval_id": approval_id, "reasons": out.reasons, "note": note},
                req.target,
                WITHDRAWN if out.ok else None,
            )
        except BaseException:
            self._unrecorded = out.ok or self._unrecorded  # a committed withdrawal without its record: the next sweep
            raise
        return out

    async def expire_due(self) -> list[str]:
        """The store's sweep (pending requests and unused approvals past their expiry), each expiry an
        `approval` record `expired` in the audit as every other transition is. Returns the ids. At a process's
        first sweep, and after a record failed, it also writes the records missing for committed expiries, votes,
        withdrawals and supersessions, and for requests created (unrecorded_requests, unrecorded_expiries,
        unrecorded_votes, unrecorded_withdrawals, unrecorded_supersessions), and this process's releases whose
        record failed. Each such record is
        appended only if the audit still lacks it, tested under the chain's append lock (`append_if_absent`),
        and so is the transition's own record: of a replica's catch-up and the writer it raced, one writes it."""
        if self.store is None:
            return []
        expired = await self.store.expire_due_rows()
        ids = [e.id for e in expired]
        catch_up, self._unrecorded = self._unrecorded and self.audit is not None, False
        # the sweep runs inside whichever call asked for it: that call's secret values must not scrub other
        # principals' records (an approver comparing them would read the caller's password back)
        outside_the_call = CALL_SECRETS.set(())
        try:
            if catch_up:
                since = time.time() - UNRECORDED_LOOKBACK_SECONDS
                for approval_id in await self.store.unrecorded_requests(since):  # first: what the others refer to
                    await self._record_late_request(await self.store.get(approval_id))
                for approval_id in await self.store.unrecorded_expiries(since):
                    if approval_id not in ids:  # committed earlier, unrecorded: read once, here
                        expired.append(Expiry.from_request(await self.store.get(approval_id)))
                        ids.append(approval_id)
                for vote in await self.store.unrecorded_votes(since):
                    await self._record_late_vote(vote)
                for withdrawal in await self.store.unrecorded_withdrawals(since):
                    await self._record_late_withdrawal(withdrawal)
                for supersession in await self.store.unrecorded_supersessions(since):
                    await self._record_late_supersession(supersession)
                for row in await self.store.unrecorded_ended_releases(since):
                    await self._record_late_ended_release(row)
                await self._record_late_releases()
            for e in expired:
                body = {"approval_id": e.id, "was": e.was, "expired_at": rfc3339(e.until)}
                await self._audit(e.id, "approval", e.requester, e.tool, "expired", body, e.target, EXPIRED)
        except BaseException:
            self._unrecorded = True  # the next sweep writes what this one could not
            raise
        finally:
            CALL_SECRETS.reset(outside_the_call)
        return ids

    async def _record_late_vote(self, vote: dict[str, Any]) -> None:
        """A committed vote's record, written by a later sweep (its own failed): who voted what, and when."""
        assert self.store is not None
        approval_id, verdict = str(vote["request_id"]), str(vote["verdict"])
        req = await self.store.get(approval_id)
        body = {
            "approval_id": approval_id,
            "verdict": verdict,
            "ok": True,
            "voted_at": rfc3339(float(vote["at"])),
            "recorded_late": "the vote was taken, its record could not be written then",
        }
        outcome = {"approve": "approved", "deny": "denied"}.get(verdict, verdict)
        await self._audit(approval_id, "approval", str(vote["approver"]), req.tool, outcome, body, req.target, VOTED)

    async def _record_late_request(self, req: ApprovalRequest) -> None:
        """A committed request's record, written by a later sweep (its own failed): what is asked, of whom."""
        body = {
            "approval_id": req.id,
            "expires_at": rfc3339(req.expires_at),
            "reason": req.reason,
            "codes": [],
            "created_at": rfc3339(req.created_at),
            "recorded_late": "the request was made, its record could not be written then",
        }
        await self._audit(req.request_id, "approval", req.requester, req.tool, "requested", body, req.target, REQUESTED)

    async def _record_late_withdrawal(self, row: dict[str, Any]) -> None:
        """A committed withdrawal's record, written by a later sweep (its own failed): who withdrew it, and when."""
        assert self.store is not None
        req = await self.store.get(str(row["id"]))
        body = {
            "approval_id": req.id,
            "reasons": [],
            "note": row["note"],
            "withdrawn_at": rfc3339(float(row["decided_at"])),
            "recorded_late": "the withdrawal was made, its record could not be written then",
        }
        who = str(row["decided_by"])
        await self._audit(req.id, "approval", who, req.tool, "withdrawn", body, req.target, WITHDRAWN)

    async def _record_late_supersession(self, row: dict[str, Any]) -> None:
        """A committed supersession's record, written by a later sweep (its own failed). The record that failed
        (`superseded`, under the superseding call's request id, with its fields), not an `expired` one: the request
        did not run out, a policy change ended it, and this is what the record of a supersession written in time
        says and what a catch-up recognises. Its call unknown (no request created then: older data), it is written
        under the request's own id, where an expiry's record would be."""
        old_id = str(row["id"])
        body = {
            "approval_id": old_id,
            "superseded_by": None if row["new_id"] is None else str(row["new_id"]),
            "note": row["note"],
            "superseded_at": rfc3339(float(row["decided_at"])),
            "recorded_late": "the request was superseded, its record could not be written then",
        }
        call = old_id if row["by_call"] is None else str(row["by_call"])
        target = json.loads(str(row["target"]))
        who, tool = str(row["requester"]), str(row["tool"])
        await self._audit(call, "approval", who, tool, "superseded", body, target, SUPERSEDED)

    async def _record_late_releases(self) -> None:
        """This process's releases whose record failed (Approvals.release), each once: a sweep running at the same
        time (they run inside calls) may have written and dropped one meanwhile."""
        pending = self._unrecorded_releases
        for call in list(pending):
            r = pending.get(call)
            if r is None:
                continue
            await self._audit(call, "approval", r["who"], r["tool"], r["outcome"], r["body"], r["target"], RELEASED)
            if pending.get(call) is r:
                del pending[call]

    async def _record_late_ended_release(self, row: dict[str, Any]) -> None:
        """A release that ended an approval withdrawn (unrecorded_ended_releases), written by a later sweep: under
        the call's request id, by the approval's requester (the one who consumed it)."""
        body = {
            "approval_id": str(row["id"]),
            "withdrawn": WITHDRAWN_WHILE_HELD,
            "released_at": rfc3339(float(row["decided_at"])),
            "recorded_late": "the approval was released, its record could not be written then",
        }
        target = json.loads(str(row["target"]))
        who, call = str(row["requester"]), str(row["used_by_request"])
        await self._audit(call, "approval", who, str(row["tool"]), "withdrawn", body, target, RELEASED)

    async def _audit(
        self,
        request_id: str,
        kind: str,
        who: str,
        tool: str | None,
        outcome: str,
        body: dict[str, Any],
        target: dict[str, Any] | None = None,
        once: tuple[tuple[str, ...], bool] | None = None,
    ) -> None:
        """Append a record; with `once` (outcomes, same principal): only if the audit lacks one such record of
        this request (a committed transition's record, which a replica's catch-up may write too)."""
        if self.audit is None:
            return
        record = AuditRecord(request_id, kind, who, tool, _audit_target(target), outcome, body)
        if once is None:
            await self.audit.append(record)
        else:
            await self.audit.append_if_absent(record, once[0], same_principal=once[1])

    async def close(self) -> None:
        if self._unrecorded_releases and self.audit is not None:  # a last try, bounded: a stop forgets them
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._record_late_releases(), CLOSE_RECORD_SECONDS)
        for call, r in self._unrecorded_releases.items():
            log.error(
                "approval %s: its release by request %s is not recorded in the audit (the store refused the record)",
                r["body"].get("approval_id"),
                call,
            )
        if self.store is not None:
            await self.store.close()


def approve_input(
    req: ApprovalRequest,
    approver: Principal,
    verdict: str,
    source_ip: str | None = None,
    *,
    auth_time: float | None = None,
    via: str = "bearer",
) -> dict[str, Any]:
    now = time.time()
    return {
        "contract_version": CONTRACT_VERSION,
        "kind": "approve",
        "approver": approver.as_input(),
        "authentication": {"auth_time": auth_time, "via": via},
        "pending": req.pending_input(),
        "request": {
            "id": "approve-" + uuid.uuid4().hex,
            "method": f"approvals/{verdict}",
            "protocol_version": None,
            "time": rfc3339(now),
            "time_ns": int(now * 1e9),
            "weekday": datetime.fromtimestamp(now, tz=UTC).strftime("%a"),
            "hour_utc": datetime.fromtimestamp(now, tz=UTC).hour,
            "source_ip": source_ip,
        },
    }


async def build_approvals(config: Config, audit: AuditLog, decisions: DecisionClient) -> Approvals:
    """The gateway's approvals: the store storage.url selects (SQLite: the audit database file),
    the page under public_url."""
    store = ApprovalStore(database(config))
    await store.open()
    base = config.public_url if config.admin.token is not None or config.console.enabled else None
    approvals = Approvals(store, audit, decisions, page_base=base)
    try:
        await approvals.expire_due()
    except BaseException:
        await store.close()
        raise
    return approvals
