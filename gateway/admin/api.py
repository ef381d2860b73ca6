"""The admin HTTP API under /admin, separate from the MCP endpoint.

Two credentials, never interchangeable:
- operator endpoints (health, metrics, audit verify/records, approval listing, withdraw)
  take the admin bearer token from `admin.token` (a secret file). It is not a
  JWT, so it can never call tools on /mcp.
- approver endpoints (approve, deny) take the approver's *own* bearer JWT,
  verified by the same Authenticator as /mcp. The admin token is refused there:
  a vote must be tied to an authenticated person, and whether that person may
  vote on that request is asked of OPA (data.pvegate.approver.decision).
An agent's MCP token is accepted at the approver door only to be judged by the
policy, which lets only humans with an approver role in the right group vote.

The routes exist only when `admin.token` is configured (the admin API is enabled).
GET /admin/approvals/{id} with a browser (Accept: text/html) is a small approval
page: it shows the request's summary without credentials (ids are 128-bit random
and nothing secret is in it) and sends the vote with the bearer JWT pasted into it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import html
import json
import logging
import math
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import jwt
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gateway.admin.reach import reached
from gateway.auth.tokens import Authenticator, AuthError
from gateway.components import Components
from gateway.core import jsonread
from gateway.core.config import ConfigError
from gateway.core.headers import repeated as header_repeated
from gateway.core.principal import Principal
from gateway.core.text import describe, encodable, may_hold_unencodable, unencodable_path, visible
from gateway.observability import metrics as metricslib
from gateway.store import audit as auditlib
from gateway.store.approvals import (
    MAX_PAGE,
    STATES,
    ApprovalRequest,
    Approvals,
    BadCursor,
    NotFound,
    VoteOutcome,
    decode_cursor,
)
from gateway.store.audit import AuditRecord
from gateway.store.db import invalid_value
from gateway.store.outcomes import RETRY_AFTER_SECONDS, STORE_ERRORS
from gateway.store.principal_limits import Limited

log = logging.getLogger("pvegate.admin")
VOTE_SLOTS = "vote:"  # a voter's vote slots are counted apart from its calls' (PrincipalLimits keys)

MAX_BODY = 16_384
DEFAULT_PAGE = 200  # GET /admin/approvals: requests per page unless `limit` says otherwise
DEFAULT_RECORDS, MAX_RECORDS = 100, 5000  # GET /admin/audit/records: the newest records per answer

# GET /admin/audit/records: the kinds and outcomes the gateway writes (docs/audit.md, "What is recorded"),
# so that a mistyped filter is a 400, not an empty page that reads as "nothing happened". A value that is
# in the audit all the same (written by another release) is accepted: the lists only speed up the answer.
AUDIT_KINDS = ("received", "decision", "dispatch", "result", "refusal", "auth_failure", "approval", "console")
AUDIT_OUTCOMES = frozenset(
    {
        *("allow", "deny", "pending"),  # decision
        *("accepted", "started"),  # dispatch
        *("ok", "failed", "upstream_error", "interrupted", "running", "reconciled"),  # result (ok: console too)
        *("invalid", "unknown_tool", "approval_refused", "approval_pending", "request_state_refused"),  # refusal
        *("protocol_error", "unsupported_version", "version_unknown", "holds_unavailable", "refused"),
        *("refusal_budget", "inflight", "host_refused", "origin_refused", "body_too_large"),
        *("body_incomplete", "body_timeout", "too_many_requests"),
        *("invalid_token", "invalid_request", "insufficient_scope"),  # auth_failure: RFC 6750 codes
        *("requested", "pending_reused", "approved", "denied", "approve_refused", "deny_refused"),  # approval
        *("withdrawn", "withdraw_refused", "consumed", "released", "superseded", "expired"),
        *("not_recorded", "failed_closed", "audit_unavailable"),  # console, refusals
        *("csrf_refused", "approval required"),  # console: a form without its token; a what-if's answer
        "suppressed",  # a summary row
    }
)


def _err(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers={"Cache-Control": "no-store"})


def _retry_later(error: str, detail: str, wait: int) -> JSONResponse:
    """429: the caller is over one of its limits for `wait` more seconds."""
    response = _err(429, error, f"{detail}: retry in {wait} s")
    response.headers["Retry-After"] = str(wait)
    return response


def source_ip(request: Request) -> str | None:
    """The peer's address, as audit records and the approver policy's `request.source_ip` carry it
    (the console's pages too)."""
    return request.client.host if request.client else None


def _components(request: Request) -> Components:
    c: Components = request.app.state.components
    return c


def _admin_secret(request: Request) -> str | None:
    state = request.app.state
    if not hasattr(state, "admin_secret"):
        ref = _components(request).config.admin.token
        try:
            state.admin_secret = ref.read() if ref is not None else None
        except (ConfigError, OSError):
            log.error("admin token cannot be read; the admin API refuses everything")
            state.admin_secret = None
    secret: str | None = state.admin_secret
    return secret or None


def _authorization_repeated(request: Request) -> bool:
    """One token per request (RFC 6750 §2): with two Authorization headers the first would be checked and
    the other left to whoever reads the last one, so a request carrying two is taken as carrying none."""
    return header_repeated(request.scope["headers"], b"authorization")


def _bearer(request: Request) -> str | None:
    if _authorization_repeated(request):
        return None
    scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _is_admin_token(request: Request) -> bool:
    secret, presented = _admin_secret(request), _bearer(request)
    return bool(secret and presented and hmac.compare_digest(secret.encode(), presented.encode()))


async def _auth_failure(request: Request, status: int, error: str, reason: str, surface: str = "admin") -> JSONResponse:
    """The refusal; its audit row is bounded per client address (store/auth_failures.py), the rest counted.
    A row that cannot be written (the audit store refuses writes) turns it into a 503 with Retry-After,
    as on /mcp: the health signal learns of the store, and nothing is served either way."""
    ip = source_ip(request)
    c = _components(request)
    try:
        await c.auth_failures.record(
            AuditRecord(
                uuid.uuid4().hex,
                "auth_failure",
                outcome=error,
                body={"reason": reason, "surface": surface, "path": request.url.path, "source_ip": ip},
            ),
            source_ip=ip,
            surface=surface,
        )
    except STORE_ERRORS as exc:
        c.outcomes.store_failed(exc)
        # the store's error is logged (store_failed), not told to a caller who presented no valid credential
        return JSONResponse(
            {"error": "audit_unavailable", "detail": "the audit store cannot take writes: retry later"},
            status_code=503,
            headers={"Cache-Control": "no-store", "Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    return _err(status, error, reason)


async def operator(request: Request) -> JSONResponse | None:
    """None if the request carries the admin token, else the error response (audited)."""
    if _is_admin_token(request):
        return None
    if _authorization_repeated(request):
        return await _auth_failure(request, 401, "invalid_request", "the Authorization header appears more than once")
    why = "missing bearer credential" if _bearer(request) is None else "operator endpoints need the admin token"
    return await _auth_failure(request, 401, "invalid_token", why)


async def approver(request: Request) -> Principal | JSONResponse:
    """The approver's own authenticated identity, or the error response (audited)."""
    if _is_admin_token(request):
        return await _auth_failure(
            request,
            403,
            "wrong_credential",
            "the admin token cannot vote on approvals: use the approver's own bearer token",
        )
    if _authorization_repeated(request):
        return await _auth_failure(request, 401, "invalid_request", "the Authorization header appears more than once")
    authn: Authenticator = request.app.state.authenticator
    try:
        return await authn.authenticate(request.headers.get("authorization"))
    except AuthError as exc:
        return await _auth_failure(request, exc.status, exc.error, str(exc))


AUTH_TIME_LEEWAY = 30  # seconds a provider's clock may run ahead (the console's ID tokens: oidc.LEEWAY)


def bearer_auth_time(token: str | None) -> float | None:
    """When the holder of an already verified bearer token authenticated: its auth_time, else its iat
    (a token minted at a login is that login). The approver policy's step-up compares it."""
    if not token:
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})  # verified by the Authenticator before
    except jwt.PyJWTError:
        return None
    for claim in ("auth_time", "iat"):
        value = claims.get(claim)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                when = float(value)
            except OverflowError:  # an int no float holds
                return None
            # a sign-in in the future (a provider's clock ahead, a token minted so) would pass every step-up
            # limit for the token's life: no known sign-in time, so the step-up fails closed (as the console's)
            return when if math.isfinite(when) and when <= time.time() + AUTH_TIME_LEEWAY else None
    return None


async def _caller(request: Request) -> str | JSONResponse:
    """Read access: the operator, or an authenticated principal (returns who)."""
    if _is_admin_token(request):
        return "operator"
    who = await approver(request)
    return who if isinstance(who, JSONResponse) else who.sub


async def _json_body(request: Request) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        return _err(413, "invalid_request", "request body too large")
    if not raw.strip():
        return {}
    try:
        # UTF-8 (RFC 8259 §8.1), surrogatepass as json.loads(bytes): a lone surrogate escape is named below
        doc = jsonread.loads(raw.decode("utf-8", "surrogatepass"), unique_names=True)
    except jsonread.NotJson as exc:  # NaN, 1e400, a name twice (`decision` approve and deny): never guessed
        return _err(400, "invalid_request", f"body must be JSON: {exc}")
    except (ValueError, RecursionError):  # nesting deeper than the parser's limit is the client's mistake too
        return _err(400, "invalid_request", "body must be JSON")
    if not isinstance(doc, dict):
        return _err(400, "invalid_request", "body must be a JSON object")
    if may_hold_unencodable(raw) and (where := unencodable_path(doc)) is not None:
        return _err(400, "invalid_request", f"{describe(where)} is not valid Unicode text")
    if (problem := note_problem(doc.get("note"))) is not None:
        return _err(400, "invalid_request", problem)
    return doc


NOTE_MAX_CHARS = 1000
# controls but tab, line feed and carriage return (a browser's textarea sends CRLF line breaks), and DEL: a note
# is text for people; NUL cannot even be stored on PostgreSQL (its text type holds none)
_NOTE_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def note_problem(note: Any) -> str | None:
    """Why a vote's or withdrawal's note is refused (the admin API and the console ask the same), or None."""
    if note is None:
        return None
    if not isinstance(note, str) or len(note) > NOTE_MAX_CHARS:
        return f"note must be a string of at most {NOTE_MAX_CHARS} characters"
    if _NOTE_CONTROLS.search(note):
        return "note must not contain control characters (tab and line breaks excepted)"
    if not encodable(note):  # a lone surrogate: no database stores it, no audit record can hold it
        return "note must be valid Unicode text"
    return None


Endpoint = Callable[[Request], Awaitable[Response]]


def store_unavailable(request: Request) -> Response:
    """The admin API's 503 when a store (the audit, approvals, quotas) cannot be read or written."""
    response = _err(503, "store_unavailable", "the gateway's database cannot be reached or written: retry later")
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def refusing_invalid_values(
    endpoint: Endpoint,
    refuse: Callable[[Request, str], Response],
    unavailable: Callable[[Request], Response] = store_unavailable,
) -> Endpoint:
    """`endpoint`, with a value the database refuses (PostgreSQL's SQLSTATE class 22: a NUL character in an id
    from the path, a number out of range) answered by `refuse` (a 400 naming it), not as an internal error:
    the request's own mistake, the statement did not run. A store that cannot be reached or written (the
    database down, the audit refusing writes, mid-request) is answered by `unavailable` (a 503 with
    Retry-After, as /mcp answers), told to the health signal, never a 500 with a stack trace."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except STORE_ERRORS as exc:
            _components(request).outcomes.store_failed(exc)  # logged there, without a traceback
            return unavailable(request)
        except Exception as exc:
            why = invalid_value(exc)
            if why is None:
                raise
            log.info("%s %s refused: %s", request.method, request.url.path, why)
            return refuse(request, why)

    return wrapped


def invalid_request(request: Request, why: str) -> Response:
    """The admin API's 400 for a refused value."""
    return _err(400, "invalid_request", why)


def _approvals(request: Request) -> Approvals:
    return _components(request).approvals


# --- operator endpoints ---------------------------------------------------------------


async def health(request: Request) -> Response:
    """/readyz's verdict (same checks, same status code) with what only an operator should see: the checks'
    private view (the store's, OPA's, an exception's own text of each failure), and more below."""
    if (denied := await operator(request)) is not None:
        return denied
    c = _components(request)
    assert c.health is not None
    ready, doc = c.health.readiness(private=True)
    # one COUNT, bounded: a slow or down approvals database is shown here, never a 500 or a hang
    counts, approvals_error = await metricslib.approval_counts(c) if c.approvals.store else (None, None)
    doc["audit"] = {
        "path": str(c.audit.path),
        "commits": c.audit.commits,
        "records": c.audit.records,
        "write_failures": c.audit.write_failures,
    }
    doc["opa"] = {
        "url": c.decisions.url,
        "managed": c.sidecar is not None,
        "process_alive": c.sidecar.alive() if c.sidecar is not None else None,
        "restarts": c.sidecar.restarts if c.sidecar is not None else 0,
    }
    # the active revision, its activation and the last bundle error, from OPA's status API
    policy = c.policy_status.as_dict() if c.policy_status is not None else None
    doc["policy"] = policy
    if ready and policy is not None and policy["error"]:
        # a refused bundle leaves the previous revision deciding: ready, but someone must look
        doc["status"] = "degraded"
    doc["approvals_pending"] = None if counts is None else counts.get("pending", 0)
    doc["approvals_error"] = approvals_error
    # the outcome reconciler: its task, last pass and the calls it still tries to settle
    doc["reconcile"] = c.health.reconciler.status() if c.health.reconciler is not None else None
    return JSONResponse(doc, status_code=200 if ready else 503, headers={"Cache-Control": "no-store"})


async def metrics(request: Request) -> Response:
    """The same exposition as GET /metrics (Prometheus text format)."""
    if (denied := await operator(request)) is not None:
        return denied
    c = _components(request)
    return Response(await metricslib.exposition(c), media_type=metricslib.CONTENT_TYPE)


def _scrape_secrets(request: Request) -> tuple[bytes, ...]:
    state = request.app.state
    if not hasattr(state, "scrape_secrets"):
        config = _components(request).config
        found = []
        for ref in (config.metrics.token, config.admin.token):
            try:
                if ref is not None and (value := ref.read()):
                    found.append(value.encode())
            except (OSError, ConfigError) as exc:
                log.error("a scrape credential cannot be read (%s); it is not accepted", type(exc).__name__)
        state.scrape_secrets = tuple(found)
    secrets_: tuple[bytes, ...] = state.scrape_secrets
    return secrets_


async def scrape(request: Request) -> Response:
    """GET /metrics: the metrics token (scrape only: it opens nothing else) or the admin token."""
    presented = _bearer(request)
    given = presented.encode() if presented else b""
    if not (given and any(hmac.compare_digest(s, given) for s in _scrape_secrets(request))):
        why = "missing bearer credential" if presented is None else "GET /metrics needs the metrics or the admin token"
        return await _auth_failure(request, 401, "invalid_token", why, surface="metrics")
    body = await metricslib.exposition(_components(request))
    return Response(body, media_type=metricslib.CONTENT_TYPE, headers={"Cache-Control": "no-store"})


async def audit_verify(request: Request) -> Response:
    """200: the chain verifies; 409: it does not (the finding in `problem`, `bad_seq`); 503 with Retry-After:
    nothing could be checked, the audit database cannot be reached (`unreachable`: not a finding, as
    `pvegate audit verify` exits 2 for it, not 1)."""
    if (denied := await operator(request)) is not None:
        return denied
    path = _components(request).audit.path
    result = await asyncio.to_thread(auditlib.verify, path, key=_components(request).audit.key_path)
    if result.unreachable:
        return JSONResponse(
            result.as_dict(),
            status_code=503,
            headers={"Cache-Control": "no-store", "Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    return JSONResponse(result.as_dict(), status_code=200 if result.ok else 409)


async def audit_records(request: Request) -> Response:
    if (denied := await operator(request)) is not None:
        return denied
    p = request.query_params
    filters = ("principal", "tool", "target", "outcome", "kind", "request_id")
    if nul := [name for name in filters if "\x00" in (p.get(name) or "")]:
        # PostgreSQL's text holds no NUL: its refusal would read as the store failing (a 503, the health
        # signal told), and no record holds one on SQLite either: the request's own mistake, said as such
        return _err(400, "invalid_request", f"{', '.join(nul)} must not contain a NUL character")
    try:
        q = auditlib.Query(
            principal=p.get("principal"),
            tool=p.get("tool"),
            target=p.get("target"),
            outcome=p.get("outcome"),
            kind=p.get("kind"),
            request_id=p.get("request_id"),
            since=unix_time(p["since"]) if p.get("since") else None,
            until=unix_time(p["until"]) if p.get("until") else None,
            limit=_records_limit(p.get("limit", str(DEFAULT_RECORDS))),
            newest_first=True,
        )
    except ValueError:
        return _err(
            400,
            "invalid_request",
            f"since/until are Unix times (finite numbers), limit an integer from 1 to {MAX_RECORDS}",
        )
    if q.since is not None and q.until is not None and q.until <= q.since:  # a window that holds no instant
        return _err(400, "invalid_request", "until must be after since")
    path = _components(request).audit.path
    rows = await asyncio.to_thread(auditlib.search, path, q)
    # an empty page: say so if a kind or outcome filter can match nothing the audit writes
    if not rows and (problem := await bad_filter(path, q)) is not None:
        return _err(400, "bad_filter", problem)
    return JSONResponse({"records": [_record(r) for r in rows]})


def _records_limit(text: str) -> int:
    """`limit`: ASCII digits from 1 to MAX_RECORDS. Over it, refused rather than cut to it: the page has no
    `more` flag, so a cut page would read as every match (and SQLite reads a negative LIMIT as none)."""
    if not (text.isascii() and text.isdecimal()) or not 1 <= int(text) <= MAX_RECORDS:
        raise ValueError("limit")
    return int(text)


async def bad_filter(path: Any, q: auditlib.Query) -> str | None:
    """Why the query's kind or outcome filter can match nothing the audit writes (nor holds), or None.
    Asked when a search found nothing (the console's audit pages ask it too), so a mistyped filter is
    refused rather than read as "nothing happened"."""
    for column, known, where in (
        ("kind", AUDIT_KINDS, f"one of {', '.join(AUDIT_KINDS)}"),
        ("outcome", AUDIT_OUTCOMES, "an outcome the audit writes (docs/audit.md)"),
    ):
        value = getattr(q, column)
        if value is not None and not await _in_audit(path, column, value, known):
            return f"{column} must be {where} (* globs), not {value!r}"
    return None


def unix_time(text: str) -> float:
    """A Unix time from a query parameter; ValueError for one that is no finite number (nan, inf, 1e400)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


async def _in_audit(path: Any, column: str, value: str, known: Collection[str]) -> bool:
    """Whether a kind or outcome filter names a value the gateway writes, or one in the audit all the same."""
    if any(auditlib.filter_matches(k, value) for k in known):
        return True
    probe = auditlib.Query(kind=value, limit=1) if column == "kind" else auditlib.Query(outcome=value, limit=1)
    return bool(await asyncio.to_thread(auditlib.search, path, probe))


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """A record as export writes it; one whose body cannot be read says so instead of failing the page."""
    try:
        doc: dict[str, Any] = json.loads(auditlib.export_line(row))
    except auditlib.AuditDataError as exc:
        return {"seq": row.get("seq"), "request_id": row.get("request_id"), "error": str(exc)}
    return doc


async def approvals_list(request: Request) -> Response:
    # the whole queue (every requester's tools, targets, arguments) is the operator's view;
    # a principal reaches one request by its unguessable id, as the approval page does
    refused = await operator(request)
    if refused is not None:
        return refused
    store = _approvals(request).store
    if store is None:
        return _err(404, "not_enabled", "approvals are not enabled")
    state = request.query_params.get("state", "pending")
    if state not in (*STATES, "all"):  # a mistyped filter must not look like an empty queue
        return _err(400, "bad_state", f"state must be one of {', '.join((*STATES, 'all'))}, not {state!r}")
    try:
        limit = int(request.query_params.get("limit", str(DEFAULT_PAGE)))
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError("limit")
    except ValueError:
        return _err(400, "invalid_request", f"limit must be an integer from 1 to {MAX_PAGE}")
    cursor = request.query_params.get("cursor") or None
    if cursor is not None:
        try:
            decode_cursor(cursor)  # refused before the sweep writes anything
        except BadCursor as exc:
            return _err(400, "bad_cursor", str(exc))
    await _approvals(request).expire_due()
    items, nxt = await store.page(None if state == "all" else [state], limit, cursor)
    # a page, not the whole queue: `more` says whether another exists, `next_cursor` opens it
    return JSONResponse({"approvals": [r.view() for r in items], "more": nxt is not None, "next_cursor": nxt})


async def approval_get(request: Request) -> Response:
    # the browser's approval page needs no credential (the 128-bit random id is the capability,
    # and it shows a summary only); everything else is authenticated before the store is touched,
    # so an unauthenticated caller learns nothing of which ids exist and writes nothing
    page = request.headers.get("authorization") is None and "text/html" in request.headers.get("accept", "")
    if not page:
        who = await _caller(request)
        if isinstance(who, JSONResponse):
            return who
    store = _approvals(request).store
    if store is None:
        return _err(404, "not_enabled", "approvals are not enabled")
    if page:
        try:
            req = await store.get(request.path_params["id"])
        except NotFound:
            return _err(404, "not_found", "no such approval request")
        return _page(_as_shown(req), _approvals(request))  # read only: no sweep on an anonymous request
    await _approvals(request).expire_due()
    try:
        req = await store.get(request.path_params["id"])
    except NotFound:
        return _err(404, "not_found", "no such approval request")
    return JSONResponse(req.view(), headers={"Cache-Control": "no-store"})


def _as_shown(req: ApprovalRequest) -> ApprovalRequest:
    """The request with the state the next sweep would give it (what the page shows, unsaved)."""
    now = time.time()
    due = (req.state == "pending" and req.expires_at <= now) or (
        req.state == "approved" and req.token_expires_at is not None and req.token_expires_at <= now
    )
    return dataclasses.replace(req, state="expired") if due else req


async def approval_withdraw(request: Request) -> Response:
    if (denied := await operator(request)) is not None:
        return denied
    body = await _json_body(request)
    if isinstance(body, JSONResponse):
        return body
    try:
        out = await _approvals(request).withdraw(request.path_params["id"], "operator", body.get("note"))
    except NotFound:
        return _err(404, "not_found", "no such approval request")
    return _vote_response(out)


# --- approver endpoints ------------------------------------------------------------------


async def _vote(request: Request, verdict: str) -> Response:
    who = await approver(request)
    if isinstance(who, JSONResponse):
        return who
    # a refused vote is a full audit row: it counts against the voter's refusal budget, as a refused
    # call does, and over it the vote is refused unwritten (an agent's token passes approver() too)
    limits = _components(request).principal_limits
    if await limits.over_budget(who.sub, f"{verdict}_refused"):
        wait = max(1, math.ceil(limits.throttled_for(who.sub) or 1))
        return _retry_later("too_many_refusals", f"too many refused requests from {who.sub}", wait)
    # and it takes one of the voter's vote slots while it runs (slots of their own: a person's votes do
    # not wait behind calls made under the same subject), so votes sent at once pass the budget by at
    # most max_inflight_per_principal, as calls do
    try:
        async with limits.admit(VOTE_SLOTS + who.sub):
            body = await _json_body(request)
            if isinstance(body, JSONResponse):
                return body
            try:
                out = await _approvals(request).decide(
                    request.path_params["id"],
                    who,
                    verdict,
                    body.get("note"),
                    auth_time=bearer_auth_time(_bearer(request)),
                    source_ip=source_ip(request),
                )
            except NotFound:
                limits.refused(who.sub)
                return _err(404, "not_found", "no such approval request")
            if not out.ok:
                limits.refused(who.sub)
            return _vote_response(out)
    except Limited as exc:  # all its vote slots are taken (the budget was checked above)
        return _retry_later("too_many_in_flight", f"too many votes of {who.sub} in flight", exc.retry_after)


async def approval_approve(request: Request) -> Response:
    return await _vote(request, "approve")


async def approval_deny(request: Request) -> Response:
    return await _vote(request, "deny")


def _vote_response(out: VoteOutcome) -> JSONResponse:
    doc: dict[str, Any] = {"ok": out.ok, "state": out.state, "reasons": out.reasons, "codes": out.codes}
    if out.ok:
        doc.update(approvals=out.approvals, needed=out.needed)
    if out.token:
        doc["token"] = out.token  # shown once; only its SHA-256 is stored
        doc["token_expires_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(out.token_expires_at or 0))
        doc["use"] = 'the agent retries the same call with this token in params._meta["pvegate/approval"]'
    return JSONResponse(doc, status_code=200 if out.ok else 403, headers={"Cache-Control": "no-store"})


def admin_routes(enabled: bool) -> list[Route]:
    """The /admin routes; none unless the admin API is enabled (admin.token configured)."""
    if not enabled:
        return []
    routes = [
        ("/admin/health", health, "GET"),
        ("/admin/metrics", metrics, "GET"),
        ("/admin/audit/verify", audit_verify, "GET"),
        ("/admin/audit/records", audit_records, "GET"),
        ("/admin/approvals", approvals_list, "GET"),
        ("/admin/approvals/{id}", approval_get, "GET"),
        ("/admin/approvals/{id}/approve", approval_approve, "POST"),
        ("/admin/approvals/{id}/deny", approval_deny, "POST"),
        ("/admin/approvals/{id}/withdraw", approval_withdraw, "POST"),
    ]
    return [
        Route(path, refusing_invalid_values(endpoint, invalid_request), methods=[method])
        for path, endpoint, method in routes
    ]


# --- the approval page ---------------------------------------------------------------------

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pvegate approval {id}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font:15px/1.4 system-ui,sans-serif;max-width:46em;margin:2em auto;padding:0 1em}}
th{{text-align:left;padding-right:1em;vertical-align:top}}textarea,input{{width:100%}}
button{{margin:.5em .5em 0 0;padding:.4em 1.2em}}
pre{{background:#f4f4f4;padding:.6em;white-space:pre-wrap;word-break:break-all}}</style>
</head><body>
<h1>Approval request</h1>
<table>
<tr><th>Request</th><td><code>{id}</code></td></tr>
<tr><th>State</th><td><b>{state}</b></td></tr>
<tr><th>Requested by</th><td>{requester}</td></tr>
<tr><th>Tool</th><td><code>{tool}</code></td></tr>
<tr><th>Target</th><td>{target}</td></tr>
{reached}<tr><th>Risk</th><td>{risk}</td></tr>
<tr><th>Why approval</th><td>{reason}</td></tr>
<tr><th>Approver groups</th><td>{groups} (needs {min_approvals}, has {approvals})</td></tr>
<tr><th>Arguments digest</th><td><code>{digest}</code></td></tr>
<tr><th>Expires</th><td>{expires}</td></tr>
</table>
<h2>Decide</h2>
<p>Paste <em>your own</em> bearer token (an approver JWT). The policy decides whether you may decide
this request; you cannot approve your own requests. The full arguments are shown after you load them
with your token. Or use the CLI: <code>{cli}</code></p>
<textarea id="tok" rows="3" placeholder="eyJ..."></textarea>
<input id="note" placeholder="note (optional)">
<button id="load">Show arguments</button><button id="approve">Approve</button><button id="deny">Deny</button>
<pre id="out"></pre>
<script nonce="{nonce}">
const base = location.pathname;
function hdr() {{ return {{"Authorization": "Bearer " + document.getElementById("tok").value.trim(),
  "Content-Type": "application/json", "Accept": "application/json"}}; }}
// what a reader would not see as itself (a bidi override, a zero-width space: an agent's name and arguments
// may hold them) as its \\uXXXX escape, as the console shows it (gateway/core/text.py); layout newlines stay
const hidden = /(?![\\t\\n\\r])[\\p{{C}}\\p{{Zl}}\\p{{Zp}}\\u115f\\u1160\\u3164\\uffa0\\u2800]/gu;
function visible(t) {{ return t.replace(hidden, (c) => Array.from({{length: c.length}},
  (_, i) => "\\\\u" + c.charCodeAt(i).toString(16).padStart(4, "0")).join("")); }}
async function show(r) {{ document.getElementById("out").textContent =
  r.status + "\\n" + visible(JSON.stringify(await r.json(), null, 1)); }}
document.getElementById("load").onclick = async () => show(await fetch(base, {{headers: hdr()}}));
for (const v of ["approve", "deny"]) {{
  document.getElementById(v).onclick = async () => show(await fetch(base + "/" + v, {{method: "POST",
    headers: hdr(), body: JSON.stringify({{note: document.getElementById("note").value || null}})}}));
}}
</script></body></html>
"""


def _page(req: ApprovalRequest, approvals: Approvals) -> HTMLResponse:
    view = req.view()

    def e(text: str) -> str:
        # the requester's name, the guest's, the reason are an agent's to choose: what a reader would not see as
        # itself (a bidi override reordering the line) is shown as its escape, as the console shows it
        return html.escape(visible(text))

    target = req.target
    tdesc = "/".join(str(target.get(k)) for k in ("cluster", "node", "vmid") if target.get(k) is not None)
    if target.get("name"):
        tdesc += f" ({target['name']})"
    if target.get("tags"):
        tdesc += " tags: " + ", ".join(str(t) for t in target["tags"])
    nonce = secrets.token_urlsafe(16)
    body = _PAGE.format(
        id=e(req.id),
        state=e(req.state),
        requester=e(req.requester),
        tool=e(req.tool),
        target=e(tdesc or "-"),
        # the guests it reaches beyond its target (a pool move's, a prune's...): the approval is bound to them
        reached="".join(f"<tr><th>{e(what)}</th><td>{e(text)}</td></tr>\n" for what, text in reached(target)),
        risk=e(f"{req.risk.get('level', '?')} (score {req.risk.get('score', '?')})"),
        reason=e(req.reason),
        groups=e(", ".join(req.approver_groups) or "-"),
        min_approvals=req.min_approvals,
        approvals=len(view["approvals"]),
        digest=e(req.arguments_digest),
        expires=e(view["expires_at"]),
        cli=e(str(approvals.how_to_approve(req.id)["cli"])),
        nonce=nonce,
    )
    return HTMLResponse(
        body,
        headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": (
                f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
                "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
            ),
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer",
            "X-Content-Type-Options": "nosniff",
        },
    )
