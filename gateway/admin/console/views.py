"""The console's pages: sign-in, approvals, audit, policy and health, tools, what-if.

Server-rendered (Jinja2, autoescaped), no JavaScript: every page is an HTML document and
every state change an HTML form with the session's CSRF token, so the CSP can forbid
scripts altogether. Whether a person may vote is the approver policy's answer
(data.pvegate.approver.decision), asked again on every vote; what a principal may see
is the visible-tools entrypoint; a what-if is the decision entrypoint with an input built
like a live call's, never dispatched. Each console action is written to the audit as a
`console` record with the signed-in person's identity.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import jinja2
import markupsafe
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.admin import api as adminapi
from gateway.admin.console.oidc import Login, Provider, SignInError, pkce_pair
from gateway.admin.console.session import Session, Sessions, csrf_ok, same_origin
from gateway.admin.reach import reached
from gateway.auth import identity
from gateway.auth.tokens import Authenticator, AuthError
from gateway.components import Components
from gateway.core import jsonread
from gateway.core.calls import CallRequest
from gateway.core.config import ConfigError
from gateway.core.principal import Principal
from gateway.core.text import cut, describe, encodable, unencodable_path, visible
from gateway.observability import metrics as metricslib
from gateway.pipeline import policy_input
from gateway.policy.decisions import CONTRACT_VERSION, PolicyError, Unanswered
from gateway.store import audit as auditlib
from gateway.store.approvals import (
    STATES,
    ApprovalRequest,
    ApprovalStore,
    BadCursor,
    NotFound,
    approve_input,
    decode_cursor,
    rfc3339,
)
from gateway.store.audit import AuditRecord
from gateway.store.handoffs import SharedStates
from gateway.store.outcomes import RETRY_AFTER_SECONDS, STORE_ERRORS
from gateway.tools.runtimes.base import CallContext, ToolError
from gateway.tools.tool import ArgumentError, Tool, arguments_digest

log = logging.getLogger("pvegate.console")

STEP_UP_CODE = "approver.step_up_required"
MASK = "••••••"
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}
AUDIT_FILTERS = ("principal", "tool", "target", "outcome", "kind", "request_id")
PAGE_SIZE = 100
OPEN_STATES = ("pending", "approved")  # the queue's default view: what may still run
RATES_LIMIT = 20_000  # decisions the status page's rates read at most (the newest of the window)
EXPORT_BATCH = 5_000  # records an export reads at a time (it streams them all)
VERIFY_TTL = 60.0
SQLITE_MAX_INT = 2**63 - 1  # an audit seq past it is no record (SQLite would raise OverflowError)


def _shown(value: Any) -> Any:
    """Every value a page writes (`finalize`): text with the characters a reader would not see as
    themselves (bidi overrides, zero-width ones, C1 controls; an agent's arguments, reasons, names
    may hold them) as their \\uXXXX escapes, so the approver reads what is there."""
    if isinstance(value, markupsafe.Markup):  # HTML already safe stays HTML (not escaped a second time)
        return markupsafe.Markup(visible(str(value)))  # noqa: S704 - the input was Markup: only escapes added
    return visible(value) if isinstance(value, str) else value


_env = jinja2.Environment(
    loader=jinja2.PackageLoader("gateway.admin.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    finalize=_shown,
)
# a time that is no time (a damaged audit record's ts: text, NaN, out of range) is shown as "?", never a 500
_NO_TIME = (TypeError, ValueError, OverflowError, OSError)


def _stamp(ts: Any, fmt: str, none: str) -> str:
    if not ts:
        return none
    try:
        return datetime.fromtimestamp(float(ts), tz=UTC).strftime(fmt)
    except _NO_TIME:
        return "?"


def _when(ts: Any) -> str:
    return _stamp(ts, "%Y-%m-%d %H:%M:%S UTC", "-")


def _ago(ts: Any) -> str:
    if not ts:
        return "-"
    try:
        s = int(time.time() - float(ts))
    except _NO_TIME:
        return "?"
    sign, s = ("in ", -s) if s < 0 else ("", s)
    text = f"{s}s" if s < 90 else f"{s // 60}m" if s < 5400 else f"{s // 3600}h {s % 3600 // 60}m"
    return f"{sign}{text}" if sign else f"{text} ago"


def _pretty(value: Any) -> str:
    # ensure_ascii=False keeps names readable; the hidden characters (only ever inside strings) are escaped
    return visible(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str))


_env.filters["when"] = _when
_env.filters["day"] = lambda ts: _stamp(ts, "%Y-%m-%d", "")
_env.filters["clock"] = lambda ts: _stamp(ts, "%H:%M:%S", "-")
_env.filters["ago"] = _ago
_env.filters["pretty"] = _pretty
_env.filters["reach_count"] = lambda target: len(reached(target)) if isinstance(target, dict) else 0


class Console:
    """The console's state in the application: the provider, the session codec, the authenticator."""

    def __init__(self, components: Components, authenticator: Authenticator) -> None:
        cfg = components.config.console
        assert cfg.session_key is not None
        self.c = components
        self.cfg = cfg
        self.authn = authenticator
        self.provider = Provider(cfg)
        self.verified: dict[str, Any] | None = None  # the last chain verification (audit page)
        self.verify_lock = asyncio.Lock()
        # sign-outs every replica honours (the shared database); None without one: cookie only
        self.signouts: SharedStates | None = None
        # Secure cookies: a browser keeps them on https and on loopback http (a secure context)
        try:
            self.sessions = Sessions(cfg.session_key.read(), cfg.idle_timeout_seconds, cfg.max_session_seconds)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _base(request: Request) -> str:
    public = _console(request).c.config.public_url
    if public:
        return str(public).rstrip("/")
    return f"{request.url.scheme}://{request.url.netloc}"


def _redirect_uri(request: Request) -> str:
    return _base(request) + "/admin/callback"


def _local_path(value: str | None) -> str:
    """Only a path under /admin/ on this site is a place to return to after sign-in (no open redirect)."""
    if not value or not value.startswith("/admin/") or "\\" in value or not value.isprintable():
        return "/admin/"
    parts = urlsplit(value)
    # a browser resolves dot segments (%2e too): /admin/..//evil.com would leave /admin/ for //evil.com
    segments = unquote(parts.path).split("/")
    if parts.scheme or parts.netloc or "//" in parts.path or any(s in (".", "..") for s in segments):
        return "/admin/"
    return value


def render(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    session: Session | None = getattr(request.state, "console_session", None)
    body = _env.get_template(template).render(
        session=session,
        sections=getattr(request.state, "console_sections", frozenset()),
        csrf=session.csrf if session else "",
        path=request.url.path,
        **ctx,
    )
    response = HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)
    if session is not None and getattr(request.state, "console_renew", False):
        _console(request).sessions.write(response, session)
    return response


async def record(
    request: Request,
    action: str,
    who: str | None,
    outcome: str,
    body: dict[str, Any] | None = None,
    *,
    tool: str | None = None,
    target: str | None = None,
    request_id: str | None = None,
) -> None:
    """A console action in the audit, with the signed-in person's identity (never a secret)."""
    session: Session | None = getattr(request.state, "console_session", None)
    doc = {"action": action, "surface": "console", "source_ip": adminapi.source_ip(request), **(body or {})}
    if session is not None:
        doc["session"] = session.sid
        doc["auth_time"] = rfc3339(session.auth_time)
    await _console(request).c.audit.append(
        AuditRecord(request_id or uuid.uuid4().hex, "console", who, tool, target, outcome, doc)
    )


# --- sessions and sign-in ------------------------------------------------------------------


async def signed_in(request: Request) -> Session | None:
    """The request's session: its cookie valid, and not signed out on any replica (fail closed:
    when the shared database cannot say, nobody is signed in)."""
    console = _console(request)
    session, renew = console.sessions.read(request)
    if session is not None and console.signouts is not None:
        try:
            gone = await console.signouts.signed_out(session.sid, session.sub, session.began)
        except STORE_ERRORS as exc:
            log.warning("console: cannot check sign-outs (%s): treated as signed out", exc)
            gone = True
        if gone:
            session, renew = None, False
    request.state.console_session = session
    request.state.console_renew = renew
    return session


SECTIONS = ("approvals", "audit", "policy")


def _listing_input(c: Components, principal: Principal, request: Request, tools: bool = False) -> dict[str, Any]:
    return {
        "contract_version": CONTRACT_VERSION,
        "kind": "list",
        "principal": principal.as_input(),
        "request": _request_facts(uuid.uuid4().hex, "tools/list", adminapi.source_ip(request)),
        "tools": c.catalog.policy_views if tools else [],
    }


async def sections_of(request: Request, principal: Principal) -> frozenset[str] | Unanswered:
    """Which console sections the policy opens to this person (data.pvegate.console.sections), or why
    the policy could not say (nothing is opened then)."""
    c = _console(request).c
    return await c.decisions.console_sections(_listing_input(c, principal, request))


def _unanswered(request: Request, why: Unanswered) -> HTMLResponse:
    """The console asked the policy and got no usable answer: a fault to wait out or fix, not a
    refusal of this person (whose roles are not the matter)."""
    return render(
        request,
        "message.html",
        503,
        title="The policy cannot answer",
        message=f"The console cannot tell which sections are open to you: {why.reason}. "
        "Nothing is opened until the policy answers again.",
    )


async def guard(request: Request, section: str) -> Session | Response:
    """The signed-in session if the policy opens `section` to it; else the sign-in redirect or a refusal."""
    session = await signed_in(request)
    if session is None:
        return _to_login(request)
    sections = await sections_of(request, session.principal)
    if isinstance(sections, Unanswered):
        return _unanswered(request, sections)
    request.state.console_sections = sections
    if section not in sections:
        return render(
            request,
            "message.html",
            403,
            title="Not open to you",
            message=f"The policy does not open the console's {section} section to {session.name} "
            f"(roles: {', '.join(session.roles) or 'none'}; groups: {', '.join(session.groups) or 'none'}).",
        )
    return session


def _to_login(request: Request) -> Response:
    if request.method == "GET":
        nxt = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    else:  # a form's URL may take only its POST (the vote's): sign-in returns to the page the form is on
        nxt = request.url.path.removesuffix("/vote")
    return RedirectResponse(f"/admin/login?{urlencode({'next': nxt})}", status_code=303, headers=SECURITY_HEADERS)


async def login(request: Request) -> Response:
    """Start a sign-in: state, nonce and PKCE verifier in a signed cookie, then off to the provider."""
    console = _console(request)
    nxt = _local_path(request.query_params.get("next"))
    max_age: int | None = None
    if (raw := request.query_params.get("max_age")) is not None:
        try:
            max_age = max(0, min(int(raw), 86400))
        except ValueError:
            return render(request, "message.html", 400, title="Sign-in", message="max_age must be a number of seconds")
    verifier, challenge = pkce_pair()
    attempt = Login(uuid.uuid4().hex + uuid.uuid4().hex, uuid.uuid4().hex, verifier, nxt, max_age)
    try:
        url = await console.provider.authorize_url(attempt, _redirect_uri(request), challenge)
    except SignInError as exc:
        return render(request, "message.html", 503, title="Sign-in unavailable", message=str(exc))
    response = RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})
    console.sessions.write_login(response, attempt.__dict__)
    return response


def _provider_text(value: str | None, limit: int) -> str:
    """An error text on the callback's query: whoever holds this browser's sign-in cookie can choose it (its
    state is readable there), so it is cut and what a reader would not see as itself is escaped before it
    reaches the refusal's audit row and the page."""
    return cut(visible(value or ""), limit)


async def callback(request: Request) -> Response:
    console = _console(request)
    stored = console.sessions.read_login(request)
    p = request.query_params
    try:
        if stored is None:
            raise SignInError("this sign-in has no attempt in progress in this browser (expired, or started elsewhere)")
        attempt = Login(**stored)
        if not p.get("state") or p.get("state") != attempt.state:
            raise SignInError("the sign-in answer does not belong to this browser's attempt (state)")
        if p.get("error"):
            said = f"{_provider_text(p.get('error'), 64)} {_provider_text(p.get('error_description'), 300)}"
            raise SignInError(f"the identity provider refused: {said.rstrip()}")
        code = p.get("code")
        if not code:
            raise SignInError("the identity provider sent no code")
        identity = await console.provider.exchange(code, attempt, _redirect_uri(request))
        principal = await _principal(console, identity.id_claims, identity.access_token)
        sections = await sections_of(request, principal)
        if isinstance(sections, Unanswered):  # the gateway's fault to mend, not this person's sign-in: 503
            unanswered = _unanswered(request, sections)
            console.sessions.clear_login(unanswered)
            return unanswered
        if not sections:
            raise SignInError(
                f"the policy opens no console section to you (roles: {', '.join(principal.roles) or 'none'}; "
                f"groups: {', '.join(principal.groups) or 'none'})"
            )
    except (SignInError, TypeError) as exc:
        reason = str(exc) if isinstance(exc, SignInError) else "the sign-in attempt is malformed"
        # anyone can send this, so its row is bounded per client address with the auth failures
        # (store/auth_failures.py): the rest counted and summarised; the row is what record() writes
        ip = adminapi.source_ip(request)
        try:
            await console.c.auth_failures.record(
                AuditRecord(
                    uuid.uuid4().hex,
                    "console",
                    outcome="refused",
                    body={"action": "sign_in", "surface": "console", "source_ip": ip, "reason": reason},
                ),
                source_ip=ip,
                surface="console",
            )
        except STORE_ERRORS as exc:  # its row cannot be written: refused all the same, as /mcp refuses (503)
            console.c.outcomes.store_failed(exc)
            message = "The audit store cannot take writes now; nothing can be signed in to. Retry later."
            return render(request, "message.html", 503, title="Sign-in unavailable", message=message)
        response = render(request, "message.html", 400, title="Sign-in failed", message=reason, retry=True)
        console.sessions.clear_login(response)
        return response
    claims = identity.id_claims
    name = str(claims.get("preferred_username") or claims.get("email") or principal.sub)
    session = Session.start(principal, name, identity.auth_time)
    if console.signouts is not None:  # compared with sign-outs, which every replica stamps on this clock
        session.db_started = await console.signouts.now()
    request.state.console_session = session
    await record(
        request,
        "sign_in",
        principal.sub,
        "ok",
        {"name": name, "kind": principal.kind, "roles": list(principal.roles), "groups": list(principal.groups)},
    )
    # a page, not a redirect: the session cookie is SameSite=Strict, and a redirect chain that began at the
    # provider is cross-site, so the browser would not send it; this page's own navigation is same-site
    response = render(request, "continue.html", title="Signed in", next=attempt.return_to)
    console.sessions.write(response, session)
    console.sessions.clear_login(response)
    return response


async def _principal(console: Console, id_claims: dict[str, Any], access_token: str | None) -> Principal:
    """Who signed in, as the gateway sees principals: the provider's access token through the same
    Authenticator as /mcp (same issuer, audience, claim mapping), bound to the ID token's subject."""
    if access_token is None:
        raise SignInError("the identity provider sent no access token")
    try:
        principal = await console.authn.authenticate(f"Bearer {access_token}")
    except AuthError as exc:
        raise SignInError(
            f"the gateway does not accept your access token ({exc}); the console's client must issue tokens "
            "for the gateway's audience (docs/console.md)"
        ) from exc
    # the subject as auth.subject_claim names it (e.g. oid, preferred_username), read from both tokens
    if principal.sub != identity.claim(id_claims, console.authn.cfg.subject_claim):
        raise SignInError("the access token and the ID token name different people")
    if principal.kind != "human":
        raise SignInError(f"the console is for people; your token makes you a principal of kind {principal.kind}")
    return principal


async def logout(request: Request) -> Response:
    console = _console(request)
    # not signed_in(): when the database cannot say whether this session was signed out, every other page
    # takes it as signed out, but a sign-out must still clear this browser's cookie and say what it could
    # not record (below), not pass for a request without a session and leave the cookie to live again
    session, _ = console.sessions.read(request)
    if session is not None and console.signouts is not None:
        try:
            if await console.signouts.signed_out(session.sid, session.sub, session.began):
                session = None  # ended already: a copy of its cookie signs nothing out (nor everyone)
        except STORE_ERRORS as exc:
            log.warning("console: cannot check sign-outs (%s): signing out all the same", exc)
    if session is None:
        # ended already (timed out, signed out elsewhere, a cookie that does not verify): signed out is what
        # was asked, and it is so. Never off to /admin/login: that starts a sign-in, and the provider's own
        # session (single sign-on) would send the browser straight back signed in again
        request.state.console_session = None
        if not same_origin(request, console.c.config.public_url):  # another site's form clears nothing here
            return render(
                request, "message.html", 403, title="Refused", message="This form was not sent from the console."
            )
        end = await console.provider.end_session_url()
        response = render(request, "message.html", title="Signed out", message="You are signed out.", end_session=end)
        console.sessions.clear(response)
        return response
    request.state.console_session = session
    request.state.console_renew = False
    form = await _form(request)
    if isinstance(form, Response):
        return form
    everywhere = form.get("everywhere") == "1"  # every session of this person, in every browser
    action = "sign_out_everywhere" if everywhere else "sign_out"
    if not (same_origin(request, console.c.config.public_url) and csrf_ok(session, form.get("csrf"))):
        return await _csrf_refused(request, session, action)
    message = "You are signed out everywhere." if everywhere else "You are signed out."
    outcome = "ok"
    body: dict[str, Any] = {}
    try:
        if console.signouts is not None and everywhere:
            body["before"] = await console.signouts.sign_out_person(session.sub, console.cfg.max_session_seconds)
        elif console.signouts is not None:  # a copy of the cookie is refused from now on, on every replica
            await console.signouts.sign_out(session.sid, session.began + console.cfg.max_session_seconds)
    except STORE_ERRORS as exc:
        log.warning("console: sign-out of %s not recorded (%s)", session.sub, exc)
        # the audit says so: an offboarding checked there must not read as done
        outcome = "not_recorded"
        body = {"error": str(exc)[:300]}
        message = (
            "You are signed out in this browser, but the gateway's database could not record it: "
            "a copy of this session's cookie"
            + (" and your other sessions stay" if everywhere else " stays")
            + " valid until the idle timeout."
        )
    await record(request, action, session.sub, outcome, body)
    end = await console.provider.end_session_url()
    request.state.console_session = None
    response = render(request, "message.html", title="Signed out", message=message, end_session=end)
    console.sessions.clear(response)
    return response


async def _csrf_refused(request: Request, session: Session, action: str) -> Response:
    await record(request, action, session.sub, "csrf_refused", {"path": request.url.path})
    return render(
        request,
        "message.html",
        403,
        title="Refused",
        message="This form was not sent from a console page of this session (missing or wrong CSRF token). "
        "Nothing was changed. Open the page again and repeat.",
    )


async def _form(request: Request) -> FormData | Response:
    if int(request.headers.get("content-length") or 0) > adminapi.MAX_BODY:
        return render(request, "message.html", 413, title="Too large", message="The form is too large.")
    form = await request.form(max_files=0, max_fields=50)
    # a body may name its charset (multipart's charset=utf-7 decodes "+2AA-" to a lone surrogate): such a
    # value is no text to compare, store or audit, so the whole form is refused before anything reads it
    for key, value in form.multi_items():
        if not encodable(key) or (isinstance(value, str) and not encodable(value)):
            message = f"Not done: the form's field {describe((key,))} is not valid Unicode text."
            return render(request, "message.html", 400, title="Refused", message=message)
    return form


# --- approvals -----------------------------------------------------------------------------


def _wants_page(request: Request) -> bool:
    return request.headers.get("authorization") is None and "text/html" in request.headers.get("accept", "")


async def approvals_page(request: Request) -> Response:
    if not _wants_page(request):  # the JSON admin API keeps its URL
        return await adminapi.approvals_list(request) if _admin_enabled(request) else _not_found()
    session = await guard(request, "approvals")
    if isinstance(session, Response):
        return session
    store = _console(request).c.approvals.store
    if store is None:
        return render(request, "message.html", 404, title="Approvals", message="Approvals are not enabled.")
    state = request.query_params.get("state", "open")
    if state not in (*STATES, "all", "open"):
        return render(request, "message.html", 400, title="Approvals", message=f"unknown state {state!r}")
    cursor = request.query_params.get("cursor") or None
    try:
        items, nxt = await queue_page(store, state, cursor, expire=_console(request).c.approvals.expire_due)
    except BadCursor:
        return render(request, "message.html", 400, title="Approvals", message="That page link is not valid.")
    more = f"/admin/approvals?{urlencode({'state': state, 'cursor': nxt})}" if nxt else None
    first = f"/admin/approvals?{urlencode({'state': state})}" if cursor else None
    return render(
        request,
        "approvals.html",
        title="Approvals",
        items=items,
        state=state,
        states=list(STATES),
        more=more,
        first=first,
        page_size=PAGE_SIZE,
    )


async def queue_page(
    store: ApprovalStore,
    state: str,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
    expire: Callable[[], Awaitable[object]] | None = None,
) -> tuple[list[ApprovalRequest], str | None]:
    """One page of the queue view `state` ("open": pending and approved; "all"; or one state) and the
    cursor of the next page: pending requests first, the one expiring soonest first, then the rest
    newest first (ApprovalStore.page). The filter is the database's, so requests in other states
    never take a page's rows."""
    if cursor:
        decode_cursor(cursor)  # BadCursor before the sweep writes anything
    await (expire or store.expire_due)()  # the gateway's Approvals.expire_due audits each expiry
    states = OPEN_STATES if state == "open" else None if state == "all" else (state,)
    return await store.page(states, limit, cursor)


def _mask(tool: Tool | None, args: Any) -> Any:
    """Arguments as shown: already redacted by the audit rules when stored; the tool's sensitive ones masked."""
    if tool is None or not isinstance(args, dict):
        return args
    out = dict(args)
    for path in tool.sensitive:
        head = path.split(".", 1)[0]
        if head in out:
            out[head] = MASK
    return out


async def _preview(c: Components, tool: Tool | None, req: ApprovalRequest) -> dict[str, Any]:
    """What the call would send: the connector's dry run (nothing is sent), or the tool's declared text.
    A read held for approval is not run for its preview: a dry run of a read is the read itself,
    and a page view must not reach Proxmox with no audit record."""
    if tool is None:
        return {"error": "the tool is no longer in the catalog"}
    cluster = str(req.target.get("cluster") or "")
    if tool.connector == "pve_api" and tool.effect != "read" and cluster in c.config.clusters:
        try:
            ctx = CallContext(cluster, dry_run=True, request_id="console-preview")
            out = await asyncio.wait_for(c.runtime(tool).call(tool, dict(req.arguments), ctx), timeout=10)
            if isinstance(out.data, dict) and out.data.get("dry_run"):
                return out.data
        except (ToolError, TimeoutError, KeyError, ValueError) as exc:
            return {"error": f"no preview: {exc}", "expected_impact": tool.dry_run}
    return {"expected_impact": tool.dry_run, "connector": tool.connector, "spec": _sends(tool)}


def _sends(tool: Tool) -> str:
    spec = tool.spec
    if tool.connector == "pve_api":
        return f"{spec.get('method')} {spec.get('path')}"
    if tool.connector == "ssh":
        argv = spec.get("argv")
        command = " ".join(str(a) for a in argv) if isinstance(argv, list) else spec.get("command") or "(command)"
        return f"ssh {spec.get('node') or ''}: {command}"
    if tool.connector == "composite":
        return "composite of " + ", ".join(str(u.get("name")) for u in tool.uses)
    return tool.connector


async def _approval_codes(c: Components, req: ApprovalRequest) -> list[str]:
    rows = await asyncio.to_thread(
        auditlib.search, c.audit.path, auditlib.Query(kind="approval", request_id=req.request_id, limit=20)
    )
    for row in rows:
        body = auditlib.body_or_empty(row["body"])
        if body.get("approval_id") == req.id and body.get("codes"):
            return [str(x) for x in body["codes"]]
    return []


async def approval_page(request: Request) -> Response:
    if not _wants_page(request):
        return await adminapi.approval_get(request) if _admin_enabled(request) else _not_found()
    session = await guard(request, "approvals")
    if isinstance(session, Response):
        return session
    return await _approval_view(request, session)


async def _approval_view(request: Request, session: Session, result: dict[str, Any] | None = None) -> Response:
    c = _console(request).c
    if c.approvals.store is None:
        return render(request, "message.html", 404, title="Approvals", message="Approvals are not enabled.")
    await c.approvals.expire_due()
    try:
        req = await c.approvals.store.get(request.path_params["id"])
    except NotFound:
        return render(request, "message.html", 404, title="Approval", message="No such approval request.")
    tool = c.catalog.get(req.tool)
    may: dict[str, Any] | None = None
    if req.state == "pending" and c.decisions is not None:
        # the same question a vote asks, without voting: may this person vote, and with which sign-in age
        verdict = await c.decisions.may_approve(
            approve_input(
                req,
                session.principal,
                "approve",
                adminapi.source_ip(request),
                auth_time=session.auth_time,
                via="console",
            )
        )
        may = {
            "allowed": verdict.allowed,
            "reasons": verdict.reasons,
            "codes": list(verdict.codes),
            "step_up": verdict.step_up_max_age,
            "only_step_up": bool(verdict.codes) and set(verdict.codes) == {STEP_UP_CODE},
        }
    return render(
        request,
        "approval.html",
        title=f"Approval {req.id}",
        req=req,
        tool=tool,
        arguments=_mask(tool, req.arguments),
        preview=await _preview(c, tool, req),
        codes=await _approval_codes(c, req),
        may=may,
        result=result,
        sends=_sends(tool) if tool else "-",
        reached=reached(req.target),
        auth_age=int(time.time() - session.auth_time),
    )


async def approval_vote(request: Request) -> Response:
    session = await guard(request, "approvals")
    if isinstance(session, Response):
        return session
    form = await _form(request)
    if isinstance(form, Response):
        return form
    aid = request.path_params["id"]
    if not (same_origin(request, _console(request).c.config.public_url) and csrf_ok(session, form.get("csrf"))):
        return await _csrf_refused(request, session, "vote")
    verdict = form.get("verdict")
    note = form.get("note") or None
    if verdict not in ("approve", "deny"):
        return render(request, "message.html", 400, title="Vote", message="verdict approve|deny")
    if (problem := adminapi.note_problem(note)) is not None:
        return render(request, "message.html", 400, title="Vote", message=f"Not recorded: the {problem}.")
    c = _console(request).c
    try:
        out = await c.approvals.decide(
            aid,
            session.principal,
            str(verdict),
            note if isinstance(note, str) else None,  # a string (note_problem), or none
            auth_time=session.auth_time,
            via="console",
            source_ip=adminapi.source_ip(request),
        )
    except NotFound:
        return render(request, "message.html", 404, title="Vote", message="No such approval request.")
    await record(
        request,
        "vote",
        session.sub,
        "ok" if out.ok else "refused",
        {"approval_id": aid, "verdict": verdict, "state": out.state, "codes": out.codes},
        request_id=aid,
    )
    result: dict[str, Any] = {
        "ok": out.ok,
        "verdict": verdict,
        "state": out.state,
        "reasons": out.reasons,
        "codes": out.codes,
        "approvals": out.approvals,
        "needed": out.needed,
        "token": out.token,  # shown once, to the approver who completed it
        "token_expires_at": rfc3339(out.token_expires_at) if out.token_expires_at else None,
        "step_up_url": None,
    }
    if STEP_UP_CODE in out.codes:
        result["step_up_url"] = "/admin/login?" + urlencode(
            {"next": f"/admin/approvals/{aid}", "max_age": str(_step_up_age(out.reasons))}
        )
    try:
        response = await _approval_view(request, session, result)
    except Exception:  # the vote is recorded: a page that fails to render must not lose the one-time token
        log.exception("console: the approval page after a vote on %s could not be rendered", aid)
        response = render(request, "message.html", title="Vote", message=_vote_summary(result))
    response.status_code = 200 if out.ok else 403
    return response


def _vote_summary(result: dict[str, Any]) -> str:
    """The vote's outcome as plain text (the approval page could not be shown): the token included."""
    text = f"Your vote ({result['verdict']}) is recorded; the request is {result['state']}."
    if result.get("reasons"):
        text += " " + " ".join(str(r) for r in result["reasons"])
    if result.get("token"):
        text += f" One-time approval token (shown once, valid until {result['token_expires_at']}): {result['token']}"
    return text


def _step_up_age(reasons: list[str]) -> int:
    """max_age for the re-authentication; the policy names its limit in the reason ("within N seconds")."""
    for r in reasons:
        words = r.split()
        for i, w in enumerate(words[:-1]):
            if w.isdigit() and words[i + 1].startswith("second"):
                return int(w)
    return 0


# --- audit ---------------------------------------------------------------------------------


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        return adminapi.unix_time(value)  # a finite number only, as the admin API takes it (nan matches nothing)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a time (Unix seconds or ISO 8601, e.g. 2026-11-30T14:00)") from exc
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def _audit_query(request: Request, limit: int | None) -> tuple[auditlib.Query, dict[str, str]]:
    p = request.query_params
    filters = {k: p[k].strip() for k in (*AUDIT_FILTERS, "since", "until") if p.get(k, "").strip()}
    if nul := [k for k, v in filters.items() if "\x00" in v]:
        # as the admin API's records page: PostgreSQL's text holds no NUL, and its refusal would read as the
        # store failing; no record holds one on SQLite either. The request's own mistake, said as such
        raise ValueError(f"{', '.join(nul)} must not contain a NUL character")
    q = auditlib.Query(
        principal=filters.get("principal"),
        tool=filters.get("tool"),
        target=filters.get("target"),
        outcome=filters.get("outcome"),
        kind=filters.get("kind"),
        request_id=filters.get("request_id"),
        since=_parse_time(filters.get("since")),
        until=_parse_time(filters.get("until")),
        limit=limit,
        newest_first=True,
    )
    return q, filters


async def _chain_status(request: Request, fresh: bool) -> dict[str, Any]:
    """The whole chain's verification, kept for VERIFY_TTL seconds: it reads every record, so a page
    view must not repeat it on a large audit (the "Verify now" link asks for a fresh one)."""
    console = _console(request)
    async with console.verify_lock:  # one verification at a time; the others wait and reuse it
        cached = console.verified
        if fresh or cached is None or time.time() - cached["at"] > VERIFY_TTL:
            c = console.c
            result = await asyncio.to_thread(auditlib.verify, c.audit.path, key=c.audit.key_path)
            cached = console.verified = {**result.as_dict(), "at": time.time()}
    return cached


async def audit_page(request: Request) -> Response:
    session = await guard(request, "audit")
    if isinstance(session, Response):
        return session
    c = _console(request).c
    try:
        q, filters = _audit_query(request, PAGE_SIZE)
    except ValueError as exc:
        return render(request, "message.html", 400, title="Audit", message=str(exc))
    found = await asyncio.to_thread(auditlib.search, c.audit.path, q)
    if not found and (problem := await adminapi.bad_filter(c.audit.path, q)) is not None:
        return render(request, "message.html", 400, title="Audit", message=problem)
    rows = [_listed(r) for r in found]
    rows.reverse()  # newest first on screen
    verify = await _chain_status(request, fresh=request.query_params.get("verify") == "1")
    try:
        checkpoint: dict[str, Any] | None = await asyncio.to_thread(
            auditlib.checkpoint, c.audit.path, key=c.audit.key_path
        )
    except Exception as exc:  # the chain page still shows; the reason is what an operator needs
        checkpoint = {"error": str(exc)[:300]}
    await record(request, "audit_search", session.sub, "ok", {"filters": filters, "rows": len(rows)})
    return render(
        request,
        "audit.html",
        title="Audit",
        rows=rows,
        filters=filters,
        fields=(*AUDIT_FILTERS, "since", "until"),
        verify=verify,
        checkpoint=checkpoint,
        export_query=urlencode(filters),
        page_size=PAGE_SIZE,
    )


async def audit_record(request: Request) -> Response:
    session = await guard(request, "audit")
    if isinstance(session, Response):
        return session
    c = _console(request).c
    seq = request.path_params["seq"]
    rows = await asyncio.to_thread(_row_by_seq, c, seq)
    if rows is None:
        return render(request, "message.html", 404, title="Audit", message=f"No audit record {seq}.")
    rid = rows["request_id"]
    related: list[dict[str, Any]] = []
    if isinstance(rid, str) and encodable(rid):  # a damaged record's request id may be no text to look for
        related = await asyncio.to_thread(auditlib.search, c.audit.path, auditlib.Query(request_id=rid, limit=200))
    damaged = _damage(rows)
    body: Any = None
    if damaged is None:
        body = auditlib.body_or_empty(rows["body"]) if rows["body"] else None
        if isinstance(body, dict):
            body.pop(auditlib.INPUT_FIELD, None)  # the packed replay input: shown decoded below instead
    return render(
        request,
        "audit_record.html",
        title=f"Audit record {seq}",
        row=_listed(rows),
        body=body,
        damaged=damaged,
        related=[_listed(r) for r in related],
    )


def _damage(row: dict[str, Any]) -> str | None:
    """Why a stored record cannot be read as a record (the sentence the export and the admin API give),
    or None: the pages show it, and the record as stored, instead of failing."""
    try:
        auditlib.parse_body(row)
    except auditlib.AuditDataError as exc:
        return str(exc)
    return None


_AUDIT_TEXT = ("request_id", "kind", "principal", "tool", "target", "outcome", "body", "prev_hash", "hash")


def _listed(row: dict[str, Any]) -> dict[str, Any]:
    """A record as a page shows it: a damaged one (`_damage`, in `damaged`) with every text column as
    text (a BLOB or a number written below the gateway as its repr), so the page renders it."""
    damaged = _damage(row)
    if damaged is None:
        return {**row, "damaged": None}
    shown = {**row, "damaged": damaged}
    for col in _AUDIT_TEXT:
        value = row.get(col)
        if not isinstance(value, str) and (value is not None or col in ("request_id", "kind", "body")):
            shown[col] = repr(value)
    return shown


def _row_by_seq(c: Components, seq: int) -> dict[str, Any] | None:
    if not 0 < seq <= SQLITE_MAX_INT:  # SQLite cannot even look for it: there is no such record
        return None
    con = auditlib.connect(c.audit.path, readonly=True)
    try:
        row = con.execute("SELECT * FROM audit WHERE seq = ?", (int(seq),)).fetchone()
    finally:
        con.close()
    return dict(row) if row is not None else None


async def audit_export(request: Request) -> Response:
    """Every record the filters match, streamed in batches (never stopped at a size, never held whole in
    memory), up to the newest one when the export began: records written meanwhile (this export's own among
    them) are the next export's. A whole export ends with its trailer (`_export_lines`)."""
    session = await guard(request, "audit")
    if isinstance(session, Response):
        return session
    c = _console(request).c
    try:
        q, filters = _audit_query(request, 1)  # newest first: the newest match is where the export ends
    except ValueError as exc:
        return render(request, "message.html", 400, title="Audit export", message=str(exc))
    newest = await asyncio.to_thread(auditlib.search, c.audit.path, q)
    if not newest and (problem := await adminapi.bad_filter(c.audit.path, q)) is not None:
        return render(request, "message.html", 400, title="Audit export", message=problem)
    end = int(newest[0]["seq"]) if newest else 0
    # recorded before any record leaves, as begun: whether it reached its end is the trailer's to say, and a
    # cut one gets a second record (`interrupted`) under the same request id
    export_id = uuid.uuid4().hex
    begun = {"filters": filters, "up_to_seq": end}
    await record(request, "audit_export", session.sub, "started", begun, request_id=export_id)

    async def cut(reason: str | None, records: int) -> None:
        """Its end, under the same request id: `ok` once the trailer went out (reason None), else
        `interrupted` with the reason, so the audit tells a whole export from a cut one."""
        outcome = "ok" if reason is None else "interrupted"
        try:
            body = {**begun, "records": records, **({"reason": reason} if reason else {})}
            await record(request, "audit_export", session.sub, outcome, body, request_id=export_id)
        except Exception as exc:  # best effort: the stream is already under way, nothing may raise into it
            log.warning("console: the end of audit export %s cannot be recorded (%s)", export_id, exc)

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return StreamingResponse(
        _export_lines(c.audit.path, dataclasses.replace(q, newest_first=False, limit=EXPORT_BATCH), end, cut),
        media_type="application/x-ndjson",
        headers={
            **SECURITY_HEADERS,
            "Content-Disposition": f'attachment; filename="pvegate-audit-{stamp}.jsonl"',
        },
    )


# the export's last line when it is whole, and the line a failed read ends it with: keys no record line has
# (auditlib.export_line's are the audit's columns and `time`; a damaged record's `seq`, `request_id`, `error`)
EXPORT_END = "export_end"
EXPORT_ERROR = "export_error"
_cut_records: set[asyncio.Task[None]] = set()  # the audit records of exports cut by their client, being written


def _export_batch(path: Any, q: auditlib.Query) -> list[dict[str, Any]]:
    """One batch of an export (blocking: run in a thread)."""
    return auditlib.search(path, q)


async def _export_lines(
    path: Any, q: auditlib.Query, end: int, cut: Callable[[str | None, int], Coroutine[Any, Any, None]]
) -> AsyncIterator[str]:
    """The export's lines, one batch of `q.limit` records at a time in seq order, through record `end`, then
    the trailer (EXPORT_END) that says it is whole: a stream without it is incomplete. A batch that cannot be
    read ends it with an EXPORT_ERROR line instead; that, a client that goes away and a server that stops it
    are recorded as cut, a whole one as `ok` (`cut`, best effort: a process that stops may not get to write it)."""
    after: int | None = None
    sent = 0
    ended = False  # the trailer or the error line went out: nothing is left to record
    try:
        while after is None or after < end:
            try:
                rows = await asyncio.to_thread(_export_batch, path, dataclasses.replace(q, after_seq=after))
            except Exception as exc:  # the response has begun: no error page, the stream says it stops
                log.error("console: audit export cut after %d record(s): a batch cannot be read (%s)", sent, exc)
                ended = True
                await cut("the audit could not be read", sent)
                yield _json_line({EXPORT_ERROR: "the audit could not be read: this export is incomplete"})
                return
            rows = [r for r in rows if r["seq"] <= end]  # written since the export began: the next export's
            if not rows:
                break
            yield "".join(_export_line(r) + "\n" for r in rows)
            sent += len(rows)
            after = int(rows[-1]["seq"])
        yield _json_line({EXPORT_END: {"records": sent, "up_to_seq": end}})
        ended = True  # only once the trailer was taken: a client gone before it has no whole export
        whole = _record_apart(cut, None, sent)
        if whole is not None:  # shielded: a client gone meanwhile does not cancel its `ok`
            await asyncio.shield(whole)
    finally:
        if not ended:
            log.warning("console: audit export stopped before its end, after %d record(s)", sent)
            _record_apart(cut, "the stream stopped before its end", sent)


def _record_apart(
    cut: Callable[[str | None, int], Coroutine[Any, Any, None]], reason: str | None, sent: int
) -> asyncio.Task[None] | None:
    """An export's end recorded in a task of its own (`ok`, reason None; else cut: cancelled, or closed at
    a yield), so a cancellation does not stop the record; None outside an event loop (the process
    ending: nothing can be written)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    task = loop.create_task(cut(reason, sent))
    _cut_records.add(task)
    task.add_done_callback(_cut_records.discard)
    return task


def _json_line(doc: dict[str, Any]) -> str:
    """A line of the export's own (its trailer, its error), written as a record's line is."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"


def _export_line(row: dict[str, Any]) -> str:
    """The record's export line; a damaged one's says so, as the admin API's record does (the
    auditor sees it, and the export goes on)."""
    try:
        return auditlib.export_line(row)
    except auditlib.AuditDataError as exc:
        doc = {"seq": row.get("seq"), "request_id": row.get("request_id"), "error": str(exc)}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=repr)


# --- policy and health --------------------------------------------------------------------


async def _decision_rates(c: Components, minutes: int = 15) -> dict[str, Any]:
    """Decisions per minute by outcome over the last minutes, and the failed-closed ones, from the audit."""
    since = time.time() - minutes * 60
    # the newest of the window when it holds more than RATES_LIMIT (a busy quarter hour): the last minutes
    # are what the page is for; the page says the earlier ones were not counted
    q = auditlib.Query(kind="decision", since=since, limit=RATES_LIMIT, newest_first=True)
    rows = await asyncio.to_thread(auditlib.search, c.audit.path, q)
    buckets: dict[str, Counter[str]] = {}
    totals: Counter[str] = Counter()
    for row in rows:
        if auditlib.damage(row) is not None:  # a time that is no time: the audit page shows the record
            continue
        minute = time.strftime("%H:%M", time.gmtime(row["ts"]))
        body = auditlib.body_or_empty(row["body"])
        outcome = "failed_closed" if body.get("failed_closed") else str(row["outcome"])
        buckets.setdefault(minute, Counter())[outcome] += 1
        totals[outcome] += 1
    return {
        "minutes": minutes,
        "buckets": sorted(buckets.items()),
        "totals": dict(totals),
        "cut": len(rows) >= RATES_LIMIT,
        "limit": RATES_LIMIT,
    }


async def status_page(request: Request) -> Response:
    session = await guard(request, "policy")
    if isinstance(session, Response):
        return session
    c = _console(request).c
    assert c.health is not None
    ready, doc = c.health.readiness()
    registry = c.metrics.registry
    failed_closed = registry.get_sample_value("pvegate_decisions_total", {"outcome": "failed_closed"}) or 0
    probe_failures = registry.get_sample_value("pvegate_opa_probe_failures_total") or 0
    counts, counts_error = await metricslib.approval_counts(c)
    return render(
        request,
        "status.html",
        title="Policy and health",
        ready=ready,
        health=doc,
        policy=c.policy_status.as_dict() if c.policy_status is not None else None,
        rates=await _decision_rates(c),
        failed_closed=int(failed_closed),
        probe_failures=int(probe_failures),
        # bounded, shared with /metrics: a database that is down or slow never fails the page
        approvals=counts if counts is not None else {},
        approvals_error=counts_error,
    )


# --- tools and what-if ----------------------------------------------------------------------


def _words(value: Any) -> list[str]:
    return [w for w in str(value or "").replace(",", " ").split() if w]


def _chosen_principal(params: Any, session: Session, sub_default: str) -> Principal:
    kind = str(params.get("kind") or "agent")
    if kind not in ("agent", "human", "service"):
        raise ValueError("kind is agent, human or service")
    sub = str(params.get("sub") or sub_default).strip()[:128] or sub_default
    return Principal(
        sub=sub,
        iss="pvegate-console-what-if",
        roles=tuple(_words(params.get("roles"))[:32]),
        groups=tuple(_words(params.get("groups"))[:32]),
        scopes=(),
        client_id=None,
        kind=kind,
    )


def _request_facts(request_id: str, method: str, source_ip: str | None) -> dict[str, Any]:
    from gateway.pipeline import request_facts

    req = CallRequest(request_id, _dummy_principal(), "", None, "console", source_ip)
    return request_facts(req, method)


def _dummy_principal() -> Principal:
    return Principal("what-if", "pvegate", (), (), (), None, "agent")


async def _tool_roles(c: Components, session: Session, request: Request) -> dict[str, list[str]]:
    """Tool name -> the roles that grant it (data.pvegate.console.tool_roles, one query); {} on doubt."""
    try:
        result, _ = await c.decisions.query(
            "pvegate/console/tool_roles", _listing_input(c, session.principal, request, tools=True)
        )
    except PolicyError:
        return {}
    if not isinstance(result, dict):
        return {}
    return {str(k): sorted(str(r) for r in v) for k, v in result.items() if isinstance(v, list)}


async def tools_page(request: Request) -> Response:
    session = await guard(request, "policy")
    if isinstance(session, Response):
        return session
    c = _console(request).c
    p = request.query_params
    visible: frozenset[str] | None = None
    chosen: Principal | None = None
    error = None
    if p.get("roles") or p.get("groups") or p.get("sub") or p.get("kind"):
        try:
            chosen = _chosen_principal(p, session, "what-if")
        except ValueError as exc:
            error = str(exc)
        else:
            visible = await c.decisions.visible_tools(_listing_input(c, chosen, request, tools=True))
            if visible is None:
                error = "OPA gave no usable answer: nothing would be visible (fail closed)"
            await record(
                request,
                "visible_tools",
                session.sub,
                "ok" if visible is not None else "failed_closed",
                {"as": chosen.as_input(), "visible": len(visible or ())},
            )
    tools = sorted(c.catalog, key=lambda t: (t.domain, t.name))
    return render(
        request,
        "tools.html",
        granted=await _tool_roles(c, session, request),
        title="Tools",
        tools=tools,
        sends=_sends,
        visible=visible,
        chosen=chosen,
        params=dict(p),
        error=error,
    )


async def whatif_page(request: Request) -> Response:
    session = await guard(request, "policy")
    if isinstance(session, Response):
        return session
    c = _console(request).c
    tools = sorted(t.name for t in c.catalog)
    if request.method == "GET":
        return render(
            request, "whatif.html", title="What if", tools=tools, params={"kind": "agent"}, decision=None, error=None
        )
    form = await _form(request)
    if isinstance(form, Response):
        return form
    if not (same_origin(request, _console(request).c.config.public_url) and csrf_ok(session, form.get("csrf"))):
        return await _csrf_refused(request, session, "what_if")
    params = {k: str(v) for k, v in form.items() if k != "csrf" and isinstance(v, str)}
    decision: dict[str, Any] | None = None
    error: str | None = None
    input_doc: dict[str, Any] | None = None
    try:
        principal = _chosen_principal(params, session, "what-if")
        tool = c.catalog.get(params.get("tool", ""))
        if tool is None:
            raise ValueError(f"unknown tool {params.get('tool')!r}")
        try:
            raw_args = jsonread.loads(params.get("arguments") or "{}", unique_names=True)
        except jsonread.NotJson as exc:  # NaN, 1e400, a name twice: what a live call's body is refused for
            raise ValueError(f"arguments must be a JSON object: {exc}") from exc
        except (ValueError, RecursionError) as exc:  # nesting past the parser's limit: the person's mistake too
            raise ValueError("arguments must be a JSON object") from exc
        if (where := unencodable_path(raw_args)) is not None:  # a lone surrogate: refused, never echoed
            raise ValueError(f"{describe(('arguments', *where))} is not valid Unicode text")
        args = tool.validate(raw_args)
        cluster = c.cluster_for(tool, args)
        dry_run = params.get("dry_run") == "on"
        digest = arguments_digest(tool.name, args, dry_run=dry_run, sensitive=tool.sensitive)
        target = await c.targets.resolve(tool, args, cluster)  # reads, as a live call does; sends nothing
        zero = {"1m": 0, "1h": 0, "24h": 0}
        call = CallRequest(
            "whatif-" + uuid.uuid4().hex, principal, tool.name, args, "console", adminapi.source_ip(request)
        )
        input_doc = policy_input(call, tool, args, digest, target, None, {"tool": zero, "all": dict(zero)}, dry_run)
        if tool.allocates:
            input_doc["resources"] = await c.targets.resources(tool, args, cluster, target)
        d = await c.decisions.decide(input_doc)  # the decision entrypoint, like a live call; never dispatched
        outcome = "allow" if d.allow else "approval required" if d.approval_required else "deny"
        decision = {"outcome": outcome, **d.as_dict()}
    except (ValueError, ArgumentError, ToolError) as exc:
        error = str(exc)
    await record(
        request,
        "what_if",
        session.sub,
        decision["outcome"] if decision else "invalid",
        {
            "as": {k: params.get(k) for k in ("sub", "kind", "roles", "groups")},
            "decision_id": decision["decision_id"] if decision else None,
            "error": error,
        },
        tool=params.get("tool"),
    )
    return render(
        request,
        "whatif.html",
        title="What if",
        tools=tools,
        params=params,
        decision=decision,
        error=error,
        target=(input_doc or {}).get("target"),
    )


# --- assets and routes ----------------------------------------------------------------------


_CSS: bytes | None = None


async def stylesheet(request: Request) -> Response:
    global _CSS
    if _CSS is None:
        _CSS = resources.files("gateway.admin.console").joinpath("static/console.css").read_bytes()
    return Response(_CSS, media_type="text/css", headers={"Cache-Control": "max-age=300"})


async def home(request: Request) -> Response:
    session = await signed_in(request)
    if session is None:
        return render(request, "welcome.html", title="pvegate console")
    sections = await sections_of(request, session.principal)
    if isinstance(sections, Unanswered):
        return _unanswered(request, sections)
    first = next((s for s in SECTIONS if s in sections), "approvals")
    target = {"approvals": "/admin/approvals", "audit": "/admin/audit", "policy": "/admin/status"}[first]
    return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)


def _admin_enabled(request: Request) -> bool:
    return _console(request).c.config.admin.token is not None


def _not_found() -> Response:
    return adminapi._err(404, "not_found", "the JSON admin API is not enabled (admin.token)")


def console_routes() -> list[Route]:
    """The console's routes; app.py puts them before the JSON admin API's (they share two URLs,
    told apart by Accept and Authorization: a browser gets the page, an API client the JSON)."""
    routes = [
        Route("/admin/", home, methods=["GET"]),
        Route("/admin/login", login, methods=["GET"]),
        Route("/admin/callback", callback, methods=["GET"]),
        Route("/admin/logout", logout, methods=["POST"]),
        Route("/admin/static/console.css", stylesheet, methods=["GET"]),
        Route("/admin/approvals", approvals_page, methods=["GET"]),
        Route("/admin/approvals/{id}", approval_page, methods=["GET"]),
        Route("/admin/approvals/{id}/vote", approval_vote, methods=["POST"]),
        Route("/admin/audit", audit_page, methods=["GET"]),
        Route("/admin/audit/export", audit_export, methods=["GET"]),
        Route("/admin/audit/record/{seq:int}", audit_record, methods=["GET"]),
        Route("/admin/status", status_page, methods=["GET"]),
        Route("/admin/tools", tools_page, methods=["GET"]),
        Route("/admin/whatif", whatif_page, methods=["GET", "POST"]),
    ]
    # a value the database refuses (a NUL character in an id from the path): a 400 naming it, not an internal error
    return [
        Route(
            r.path, adminapi.refusing_invalid_values(r.endpoint, _invalid_value, _store_unavailable), methods=r.methods
        )
        for r in routes
    ]


def _invalid_value(request: Request, why: str) -> Response:
    if _wants_page(request):
        return render(request, "message.html", 400, title="Refused", message=f"Not done: {why}.")
    return adminapi.invalid_request(request, why)


def _store_unavailable(request: Request) -> Response:
    if _wants_page(request):
        message = "The gateway's database cannot be reached or written now: what you asked may not be done. Retry."
        response = render(request, "message.html", 503, title="Unavailable", message=message)
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
    return adminapi.store_unavailable(request)
