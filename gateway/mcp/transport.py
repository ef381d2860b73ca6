"""MCP over Streamable HTTP at /mcp: one lean Starlette handler for both protocol eras.

Stateless, JSON responses only (no SSE stream, no server-held sessions):
- handshake era (2025-03-26, 2025-06-18, 2025-11-25): `initialize`, then the
  `MCP-Protocol-Version` header on every request;
- 2026-07-28: every request self-describing (`_meta` envelope + routing headers).
The SDK's server machinery is not on this path (see docs/mcp.md for the
measurement); its pure helpers and wire types are used to get the format right.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth.tokens import Authenticator, AuthError
from gateway.components import Components
from gateway.core.headers import repeated as header_repeated
from gateway.core.principal import Principal
from gateway.mcp import handoff, methods, modern, principal_limits
from gateway.mcp.jsonrpc import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Message,
    RpcFault,
    error_response,
    parse_message,
    result_response,
)
from gateway.mcp.request_state import RequestStates, Sessions
from gateway.mcp.wellknown import authorization_servers, metadata_url
from gateway.store.audit import AuditRecord
from gateway.store.outcomes import (
    AUDIT_UNAVAILABLE,
    RETRY_AFTER_SECONDS,
    SHUTTING_DOWN,
    STORE_ERRORS,
    AuditUnavailable,
    ClaimLost,
)

log = logging.getLogger("pvegate.transport")

LEGACY_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST_LEGACY = LEGACY_VERSIONS[-1]
DEFAULT_VERSION = "2025-03-26"  # what the spec says to assume when the header is absent
SESSION_HEADER = "mcp-session-id"


def www_authenticate(c: Components, err: AuthError) -> str:
    # no credentials at all: the challenge names no error (RFC 6750 §3.1), only where to get a token
    parts = [f'error="{err.error}"', f'error_description="{_quote(str(err))}"'] if err.credentials else []
    if err.scope:
        parts.append(f'scope="{" ".join(err.scope)}"')
    if authorization_servers(c.config):  # else there is no metadata document to point at (wellknown.py)
        parts.append(f'resource_metadata="{metadata_url(c.config)}"')
    return " ".join(["Bearer", ", ".join(parts)]) if parts else "Bearer"


def _quote(text: str) -> str:
    """RFC 6750 allows only printable ASCII without quote and backslash in error_description
    (and a header must be Latin-1): anything else, from a token's own fields, becomes '?'."""
    text = text.replace('"', "'")
    return "".join(ch if " " <= ch <= "~" and ch != "\\" else "?" for ch in text)


def _source_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


async def authenticate(c: Components, request: Request) -> Principal | Response:
    authn: Authenticator = request.app.state.authenticator
    started = time.perf_counter()
    try:
        if header_repeated(request.scope["headers"], b"authorization"):
            # one token per request (RFC 6750 §2): the first copy would be verified, the other left to
            # whoever reads the last one (an intermediary), so neither is taken
            raise AuthError("the Authorization header appears more than once", error="invalid_request")
        principal = await authn.authenticate(request.headers.get("authorization"))
    except AuthError as err:
        c.metrics.observe("authenticate", started)
        source_ip = _source_ip(request)
        # bounded per client address (store/auth_failures.py): the rest are counted and summarised
        await c.auth_failures.record(
            AuditRecord(
                uuid.uuid4().hex,
                "auth_failure",
                outcome=err.error,
                body={"reason": str(err), "status": err.status, "source_ip": source_ip},
            ),
            source_ip=source_ip,
            surface="mcp",
        )
        return JSONResponse(
            {"error": err.error, "error_description": str(err)},
            status_code=err.status,
            headers={"WWW-Authenticate": www_authenticate(c, err)},
        )
    c.metrics.observe("authenticate", started)
    return principal


def _media_type(value: str) -> str:
    return value.split(";")[0].strip().lower()


# RFC 9110 §12.5.1: a weight is 0 to 1 with at most three decimals; q=0 means "not acceptable"
_QVALUE = re.compile(r"0(\.\d{0,3})?|1(\.0{0,3})?")
# most specific first: the most specific range that names JSON gives its weight (§12.5.1)
_JSON_RANGES = ("application/json", "application/*", "*/*")


def _accepts_json(accept: str | None) -> bool:
    if accept is None:
        return True  # lenient with minimal clients; a present header must allow JSON
    weights: dict[str, float] = {}
    for part in accept.split(","):
        media_type, *params = part.split(";")
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                value = value.strip()
                # a weight that is not one: the range is not taken as allowing anything (fail closed)
                weight = float(value) if _QVALUE.fullmatch(value) else 0.0
        weights.setdefault(media_type.strip().lower(), weight)
    return next((weights[r] for r in _JSON_RANGES if r in weights), 0.0) > 0


async def handle_mcp(request: Request) -> Response:
    c: Components = request.app.state.components
    if c.outcomes.draining:  # SIGTERM: calls in flight finish, new ones go elsewhere
        c.outcomes.counters.refused_draining += 1
        return await _unavailable(
            request, SHUTTING_DOWN, "pvegate is shutting down and takes no new calls; retry shortly"
        )
    try:
        return await _handle_mcp(c, request)
    except (AuditUnavailable, *STORE_ERRORS) as exc:  # fail closed, and say why: never a bare 500
        return await _unavailable(request, AUDIT_UNAVAILABLE, audit_unavailable_message(c, exc))


def audit_unavailable_message(c: Components, exc: Exception) -> str:
    """The AUDIT_UNAVAILABLE error message for an audit failure (shared with the stdio transport);
    a raw store error is remembered for the health signal first (and logged).

    The store's own words stay with the operator (the log, /admin/health): they name the database's host,
    port, role and database, or the audit directory, and any client gets this answer, an unauthenticated
    one included (its auth_failure row could not be written)."""
    if not isinstance(exc, AuditUnavailable):
        c.outcomes.store_failed(exc)
    if isinstance(exc, ClaimLost):  # this replica's lease, in the gateway's words: nothing of the store's
        return f"{exc}; nothing was sent to Proxmox. Retry (on any replica)"
    return (
        "the audit store cannot take writes, so no call is run; nothing was sent to Proxmox. "
        "Retry later (the reason is in the gateway's log and /admin/health)"
    )


async def _unavailable(request: Request, code: int, message: str) -> Response:
    """503 with Retry-After and a JSON-RPC error (the request's id when it can be read)."""
    id_: Any = None
    with contextlib.suppress(Exception):
        id_ = parse_message(await request.body()).id
    response = error_response(id_, code, message, status=503)
    response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


async def _handle_mcp(c: Components, request: Request) -> Response:
    if request.method != "POST":
        # No server-initiated SSE stream and no server-held session to delete.
        return Response(status_code=405, headers={"Allow": "POST"})
    principal = await authenticate(c, request)
    if not isinstance(principal, Principal):
        return principal
    if _media_type(request.headers.get("content-type", "")) != "application/json":
        refusal = error_response(None, INVALID_REQUEST, "Content-Type must be application/json", status=415)
        return await _refuse(c, principal, request, refusal)
    if not _accepts_json(request.headers.get("accept")):
        refusal = error_response(None, INVALID_REQUEST, "Accept must allow application/json", status=406)
        return await _refuse(c, principal, request, refusal)
    version_header = request.headers.get("mcp-protocol-version")
    msg: Message | None = None
    try:
        msg = parse_message(await request.body())
        # a routing header sent twice is refused in both eras, before the era is chosen from its first
        # copy: an intermediary reading the last copy would route the request differently
        modern.refuse_duplicated_routing_headers(msg, request.scope["headers"])
        if modern.is_modern(version_header):
            assert version_header is not None
            return await _modern(c, principal, request, msg, version_header)
        return await _legacy(c, principal, request, msg, version_header)
    except RpcFault as fault:
        if fault.id is None and msg is not None:
            fault.id = msg.id
        status = _status(fault, modern.is_modern(version_header))
        if fault.http_status is not None:  # its own status in both eras (429 at the door, 503 without a policy)
            status = fault.http_status
        response = error_response(fault.id, fault.code, fault.message, fault.data, status=status)
        if fault.retry_after is not None:
            response.headers["Retry-After"] = str(fault.retry_after)
        if fault.audited:
            return response
        return await _refuse(c, principal, request, response, fault)


def _status(fault: RpcFault, is_modern: bool) -> int | None:
    """Modern era: the SDK's code→status table. Handshake era: 400 for envelope faults (a routing
    header sent twice among them) and for a fault with no id to answer (a notification refused: the
    spec wants an HTTP error for input not accepted, and a 200 would read as a response; 500 when the fault
    is the gateway's own), else 200."""
    if is_modern:
        return None
    if fault.code in (PARSE_ERROR, INVALID_REQUEST, HEADER_MISMATCH):
        return 400
    if fault.id is None:
        return 500 if fault.code == INTERNAL_ERROR else 400
    return 200


async def _refuse(
    c: Components, principal: Principal, request: Request, response: Response, fault: RpcFault | None = None
) -> Response:
    """Audit a protocol-level refusal of an authenticated request, then send it. It counts against the
    principal's refusal budget; one over its budget gets the same answer, counted, not written
    (store/principal_limits.py)."""
    limits = c.principal_limits
    refusal = principal_limits.counts(fault)
    if refusal and await limits.over_budget(principal.sub, "protocol_error"):
        return response
    if refusal:  # counted before it is written: faults sent at once see each other
        limits.refused(principal.sub)
    body: dict[str, Any] = {"status": response.status_code, "source_ip": _source_ip(request)}
    if fault is not None:
        body.update(code=fault.code, reason=fault.message)
    await c.audit.append(AuditRecord(uuid.uuid4().hex, "refusal", principal.sub, None, None, "protocol_error", body))
    return response


def _exchange(
    c: Components, principal: Principal, request: Request, version: str, modern_era: bool, url_elicitation: bool
) -> methods.Exchange:
    states: RequestStates = request.app.state.request_states
    return methods.Exchange(c, principal, version, modern_era, _source_ip(request), url_elicitation, states)


# Methods that are requests: sent without an id (a notification) they would be accepted and never run nor
# answered, the client's mistake unreported; such input is not accepted, so it gets an HTTP error (the spec:
# 202 only for a notification the server accepts), audited as the other malformed requests are.
REQUEST_METHODS = frozenset({"initialize", "ping", "tools/list", "tools/call", "server/discover"})


def refuse_request_without_id(msg: Message) -> None:
    if msg.is_notification and msg.method in REQUEST_METHODS:
        raise RpcFault(
            INVALID_REQUEST,
            f'Invalid Request: {msg.method} needs an "id"; sent without one (as a notification) it is not run',
            http_status=400,
        )


async def _modern(c: Components, principal: Principal, request: Request, msg: Message, version_header: str) -> Response:
    if msg.is_notification:
        modern.check_notification(version_header)
        refuse_request_without_id(msg)
        return Response(status_code=202)
    raw_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]]
    version, capabilities = modern.classify(msg, dict(request.headers), raw_headers)
    x = _exchange(c, principal, request, version, True, modern.wants_url_elicitation(capabilities))
    return result_response(msg.id, await modern.dispatch(x, msg))


async def _legacy(
    c: Components, principal: Principal, request: Request, msg: Message, version_header: str | None
) -> Response:
    if msg.method == "initialize" and not msg.is_notification:
        return _initialize(request, principal, msg)
    version = version_header or DEFAULT_VERSION
    if version not in LEGACY_VERSIONS:  # a notification too: an unsupported version is a 400 (as in 2026-07-28)
        raise RpcFault(
            INVALID_REQUEST,
            f"Unsupported protocol version: {version}; supported: {', '.join((*LEGACY_VERSIONS, *modern.SUPPORTED))}",
            id_=msg.id,
        )
    if msg.is_notification:  # notifications/initialized, cancelled, ...: accepted, nothing to answer
        refuse_request_without_id(msg)
        return Response(status_code=202)
    sessions: Sessions = request.app.state.sessions
    elicit = sessions.url_elicitation(request.headers.get(SESSION_HEADER), principal)
    x = _exchange(c, principal, request, version, False, elicit)
    if msg.method == "ping":
        return result_response(msg.id, {})
    if msg.method == "tools/list":
        return result_response(msg.id, await methods.list_tools(x))
    if msg.method == "tools/call":
        return result_response(msg.id, await methods.call(x, msg.params))
    raise RpcFault(METHOD_NOT_FOUND, f"Method not found: {msg.method}", id_=msg.id)


def initialize_result(msg: Message) -> tuple[str, dict[str, Any]]:
    """The negotiated version and the `initialize` result (shared with the stdio transport)."""
    asked = msg.params.get("protocolVersion")
    if not isinstance(asked, str):
        raise RpcFault(INVALID_PARAMS, "Invalid params: initialize needs a protocolVersion", id_=msg.id)
    # Counter-offer our latest when we do not speak the asked revision (the client may then disconnect).
    version = asked if asked in LEGACY_VERSIONS else LATEST_LEGACY
    result = {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": methods.SERVER_INFO,
        "instructions": methods.INSTRUCTIONS,
    }
    return version, result


def _initialize(request: Request, principal: Principal, msg: Message) -> Response:
    version, result = initialize_result(msg)
    headers: dict[str, str] = {}
    if version >= "2025-11-25" and handoff.url_elicitation_declared(msg.params.get("capabilities")):
        # Stateless memory of the declared capability: a sealed session id the client echoes.
        sessions: Sessions = request.app.state.sessions
        headers["Mcp-Session-Id"] = sessions.mint(principal, version, True)
    return result_response(msg.id, result, headers=headers)
