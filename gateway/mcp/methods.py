"""The MCP methods both protocol eras share: tools/list and tools/call.

Tool-level outcomes (policy denial, invalid arguments, pending approval, a
failed connector) are tool results with isError, which a model can act on;
unknown tools and protocol faults raise RpcFault. Both methods pass their
principal's door first (principal_limits.py: calls in flight, refusal budget),
and a call's refusals are counted against that budget.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from gateway import __version__
from gateway.components import Components
from gateway.core.calls import CallRequest, CallResult
from gateway.core.jsonenc import Encoded, dumps
from gateway.core.principal import Principal
from gateway.mcp import handoff, principal_limits
from gateway.mcp.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, URL_ELICITATION_REQUIRED, RpcFault
from gateway.mcp.request_state import ApprovalState, RequestStates, StateError
from gateway.observability import logs
from gateway.pipeline import UnknownTool, call_tool, request_facts, shown_tool_name
from gateway.policy.decisions import CONTRACT_VERSION, FAIL_CLOSED_CODE
from gateway.policy.listings import listing_key
from gateway.store.approvals import NotFound
from gateway.store.audit import AuditRecord
from gateway.store.outcomes import RETRY_AFTER_SECONDS, STORE_ERRORS, AuditUnavailable
from gateway.tools.catalog import Catalog
from gateway.tools.tool import arguments_digest

log = logging.getLogger("pvegate.mcp")

SERVER_INFO = {"name": "pvegate", "title": "pvegate Proxmox VE gateway", "version": __version__}
INSTRUCTIONS = (
    "Proxmox VE tools behind a policy gateway. Every call is decided by the operator's policy: a denial says why, "
    "and a call that needs a human approval returns the approval request id and how to retry."
)
# Fields a tool definition gained after 2025-03-26; older clients get the original shape.
_NEWER_TOOL_FIELDS = ("title", "outputSchema")


@dataclass(frozen=True)
class Exchange:
    """One authenticated MCP request, whichever era it came in."""

    c: Components
    principal: Principal
    version: str
    modern: bool
    source_ip: str | None
    url_elicitation: bool  # the client declared URL-mode elicitation
    states: RequestStates


def raw_meta_lacks_token(meta: dict[str, Any]) -> bool:
    return meta.get("pvegate/approval") is None  # an explicit one-time token takes precedence


def request_digest(x: Exchange, name: str, arguments: Any, dry_run: bool) -> str:
    """What a requestState is bound to: the tool, its exact arguments and whether it is a dry run (the
    approval binding's digest, the tool's sensitive arguments counted as redacted: it is stored for the
    legacy handoff). A rehearsal and the real call are two approvals, so two hand-offs."""
    tool = x.c.catalog.get(name)
    sensitive = tool.sensitive if tool is not None else ()
    args = arguments if isinstance(arguments, dict) else {}
    return arguments_digest(name, args, dry_run=dry_run, sensitive=sensitive)


# a tools/call's outcomes (CallResult.outcome) that count against its principal's refusal budget: denied
# (by policy, a quota, or an approval refused), invalid (arguments, an unsupported version, a connector's
# refusal), and pending_approval: a held call and each retry of it before the vote is a `refusal` row
# (approval_pending), so polling is bounded too (a poll every 2 s is 30 a minute). Not failed
# (upstream) or interrupted.
REFUSED_OUTCOMES = frozenset({"denied", "invalid", "pending_approval"})
# a denial that is the gateway's own fault, not the principal's: no usable policy answer (OPA down, slow,
# undefined), or policy data the check refuses; counted, every agent would be locked out once it mends
GATEWAY_FAULT_CODES = frozenset({FAIL_CLOSED_CODE, "data.invalid"})
# JSON-RPC code in the implementation-defined band (-32010 to -32012 are taken: store/outcomes.py,
# principal_limits.py): tools/list without a usable policy answer
POLICY_UNAVAILABLE = -32013


def policy_unavailable() -> RpcFault:
    """tools/list without a usable policy answer (OPA down or off the contract, invalid policy data): an
    error the client may retry, never an empty listing, which is a valid answer (and, 2026-07-28, one
    cached for ttlMs). Nothing of OPA's own words: they are in the log and /admin/health. `audited`:
    there is no refusal to record, and it is the gateway's failure, not one the principal is counted for."""
    return RpcFault(
        POLICY_UNAVAILABLE,
        "policy decision unavailable: the tool listing cannot be decided now; retry shortly",
        {"retry_after_seconds": RETRY_AFTER_SECONDS},
        audited=True,
        http_status=503,  # the gateway's own failure, retryable
        retry_after=RETRY_AFTER_SECONDS,
    )


async def list_tools(x: Exchange) -> dict[str, Any]:
    async with principal_limits.door(x.c.principal_limits, x.principal.sub):  # one of its slots, or refused
        listing = await _list_tools(x)
    if listing is None:  # raised out of the door: a fault raised in it would count as the principal's refusal
        raise policy_unavailable()
    return listing


async def _list_tools(x: Exchange) -> dict[str, Any] | None:
    """The listing, or None when the policy gave no usable answer."""
    req = CallRequest(uuid.uuid4().hex, x.principal, "", None, x.version, x.source_ip)
    input_doc = {
        "contract_version": CONTRACT_VERSION,
        "kind": "list",
        "principal": x.principal.as_input(),
        "request": request_facts(req, "tools/list"),
        "tools": x.c.catalog.encoded_policy_views,  # encoded once: sent as it is
    }
    key = listing_key(input_doc)
    visible = x.c.listings.get(key)
    if visible is None:
        visible = await x.c.decisions.visible_tools(input_doc)  # one OPA query per listing
        if visible is None:  # any doubt: no listing at all (not kept: asked again next time)
            log.warning("tools/list for %s: no usable policy answer; answered with an error", x.principal.sub)
            return None
        x.c.listings.put(key, visible)
    fragments = _tool_fragments(x.c.catalog, x.version == "2025-03-26")
    # the visible tools' definitions, each encoded once per catalog: joined, not re-serialised
    return {"tools": Encoded(b"[" + b",".join(f for name, f in fragments if name in visible) + b"]")}


# catalog -> era (True: 2025-03-26) -> (name, encoded tool definition) in catalog order
_FRAGMENTS: WeakKeyDictionary[Catalog, dict[bool, tuple[tuple[str, bytes], ...]]] = WeakKeyDictionary()


def _tool_fragments(catalog: Catalog, original_shape: bool) -> tuple[tuple[str, bytes], ...]:
    """Every tool's tools/list definition as JSON, built once per catalog (a catalog never changes)."""
    per_era = _FRAGMENTS.setdefault(catalog, {})
    fragments = per_era.get(original_shape)
    if fragments is None:
        views = ((t.name, t.mcp_view) for t in catalog)
        if original_shape:  # older clients get the original shape
            views = ((n, {k: v for k, v in view.items() if k not in _NEWER_TOOL_FIELDS}) for n, view in views)
        fragments = per_era[original_shape] = tuple((n, dumps(view)) for n, view in views)
    return fragments


async def _keep_retry_handle(x: Exchange, digest: str, approval_id: str, state: ApprovalState | None) -> None:
    """A retry refused before anything was sent gives its approval back (pipeline `_unspent`); the
    handle it came with must then work again, or the approval is stranded: a requestState is spent
    on redemption, a 2025-11-25 hand-off taken on recall (found by a review: the client was told
    to call without it, and a new approval request was opened beside the approved one)."""
    store = x.c.approvals.store
    if store is None:
        return
    try:
        held = await store.get(approval_id)
    except (NotFound, *STORE_ERRORS):  # the refusal stands; a new approval is the worst case
        log.warning("approval %s: could not tell whether the retry's handle may be kept", approval_id, exc_info=True)
        return
    if held.state != "approved":  # given back (release clears used_at with it)
        return
    try:
        if state is not None:
            await x.states.give_back(state)
        else:
            await x.states.remember(x.principal, digest, approval_id)
    except STORE_ERRORS:  # the refusal stands as it was: a new approval is the worst case
        log.warning("approval %s: the retry's handle could not be kept", approval_id, exc_info=True)


def _codes(result: CallResult) -> list[Any]:
    codes = (result.structured or {}).get("codes") if isinstance(result.structured, dict) else None
    return codes if isinstance(codes, list) else []


def tool_result(result: CallResult, request_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": result.text}], "isError": result.is_error}
    if result.structured is not None:
        out["structuredContent"] = result.structured
    out["_meta"] = {"pvegate/request_id": request_id, "pvegate/outcome": result.outcome, **result.meta}
    return out


async def _run(x: Exchange, req: CallRequest) -> CallResult:
    """call_tool with the call's log context, in-flight gauge, latency and one log line per call."""
    m = x.c.metrics
    m.calls_in_flight.inc()
    started = time.perf_counter()
    outcome = "error"
    try:
        result = await call_tool(x.c, req)
        outcome = result.outcome
        return result
    except UnknownTool as exc:
        outcome = "unknown_tool"
        raise RpcFault(INVALID_PARAMS, f"Unknown tool: {shown_tool_name(req.tool)}", audited=True) from exc
    except AuditUnavailable:
        outcome = "audit_unavailable"
        raise  # a clear refusal (transport.py), not an internal error
    except Exception as exc:  # never a stack trace on the wire; the id finds it in the log
        log.exception("internal error in tools/call %s (request %s)", req.tool, req.request_id)
        raise RpcFault(INTERNAL_ERROR, f"Internal error (request {req.request_id})") from exc
    finally:
        took = time.perf_counter() - started
        m.calls_in_flight.dec()
        m.call_done(outcome, took)
        logs.calls_log.info(
            "tools/call %s by %s: %s",
            req.tool,
            x.principal.sub,
            outcome,
            extra={"event": "call", "outcome": outcome, "duration_ms": round(took * 1000, 3)},
        )


async def call(x: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    """tools/call behind its principal's door: a slot of its own while it runs, refused at once when
    the principal is over its refusal budget; its refusal (an outcome or an audited fault) counted."""
    async with principal_limits.door(x.c.principal_limits, x.principal.sub):
        return await _call(x, params)


async def _call(x: Exchange, params: dict[str, Any]) -> dict[str, Any]:
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise RpcFault(INVALID_PARAMS, "Invalid params: tools/call needs a tool name")
    if x.c.catalog.get(name) is None:  # the client's own text from here on (log, audit, reply): bounded
        name = shown_tool_name(name)
    arguments = params.get("arguments")
    raw_meta = params.get("_meta")
    meta: dict[str, Any] = dict(raw_meta) if isinstance(raw_meta, dict) else {}
    if not isinstance(meta.get("dry_run", False), bool):  # "false", 0 or [] must not turn a dry run on
        raise RpcFault(INVALID_PARAMS, 'Invalid params: "_meta.dry_run" must be true or false')
    meta.pop(handoff.APPROVAL_REQUEST_META, None)  # only a verified requestState may set this
    dry_run: bool = meta.get("dry_run", False)
    request_id = uuid.uuid4().hex
    logs.bind(request_id, x.principal.sub, name)  # every log line of this call carries them
    retry = x.modern and params.get("requestState") is not None
    # what a hand-off is bound to: computed once, and only when one is used or made (not on every call of a
    # client that could take one)
    digest = request_digest(x, name, arguments, dry_run) if retry else ""
    state: ApprovalState | None = None
    if retry:
        try:
            state = await x.states.redeem(params["requestState"], x.principal, digest)
        except StateError as exc:
            await x.c.audit.append(
                AuditRecord(
                    request_id, "refusal", x.principal.sub, name, None, "request_state_refused", {"error": str(exc)}
                )
            )
            raise RpcFault(
                INVALID_PARAMS,
                f"Invalid params: requestState refused ({exc}); call the tool again without requestState",
                audited=True,
            ) from exc
        meta[handoff.APPROVAL_REQUEST_META] = state.approval_id
    elif not x.modern and x.url_elicitation and raw_meta_lacks_token(meta):
        digest = request_digest(x, name, arguments, dry_run)
        recalled = await x.states.recall(x.principal, digest)
        if recalled is not None:  # the retry after a -32042 URL elicitation we sent this principal
            meta[handoff.APPROVAL_REQUEST_META] = recalled
            retry = True
    req = CallRequest(request_id, x.principal, name, arguments, x.version, x.source_ip, meta)
    try:
        result = await _run(x, req)
    except AuditUnavailable:
        # refused unsent with a 503 that asks for a retry: that retry needs its handle (a store that failed
        # on the way keeps the approval used, and _keep_retry_handle then keeps nothing)
        if retry:
            await _keep_retry_handle(x, digest, str(meta[handoff.APPROVAL_REQUEST_META]), state)
        raise
    if retry and result.outcome != "allowed":
        await _keep_retry_handle(x, digest, str(meta[handoff.APPROVAL_REQUEST_META]), state)
    if result.outcome in REFUSED_OUTCOMES and not GATEWAY_FAULT_CODES.intersection(_codes(result)):
        x.c.principal_limits.refused(x.principal.sub)
    aid = handoff.approval_id(result)
    # also after a retry: one made before the approver voted is held again, with a fresh handle
    if result.outcome == "pending_approval" and aid and x.url_elicitation:
        digest = digest or request_digest(x, name, arguments, dry_run)
        if x.modern:
            token = x.states.mint(x.principal, digest, aid)
            out = handoff.input_required(x.c.config, result, aid, token)
            out["_meta"] = {"pvegate/request_id": request_id, "pvegate/outcome": result.outcome, **result.meta}
            return out
        if x.version >= "2025-11-25":
            await x.states.remember(x.principal, digest, aid)
            raise RpcFault(
                URL_ELICITATION_REQUIRED,
                "This call needs a human approval: open the URL, then retry the call",
                handoff.url_elicitation_error_data(x.c.config, result, aid),
            )
    return tool_result(result, request_id)
