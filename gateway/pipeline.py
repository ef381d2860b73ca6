"""The hot path: one tools/call from authenticated principal to audited result.

resolve tool → validate arguments → enrich (target, approval, usage) → one OPA
query → enforce → dispatch → shape → audit. The gateway decides nothing here:
it builds the input, asks OPA, and does what the answer says (an allocating call
the answer allows into a pool holds what it asks for there and asks again, so
calls in flight count: store/holds.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from gateway.components import Components
from gateway.core.calls import CallRequest, CallResult
from gateway.core.canonical import digest_json
from gateway.policy.decisions import CONTRACT_VERSION, Decision
from gateway.store.audit import (
    CALL_SECRETS,
    AuditRecord,
    Scrubber,
    audit_arguments,
    redacted_paths,
    secret_values,
)
from gateway.store.holds import CallHold, HoldsUnavailable
from gateway.store.outcomes import STORE_ERRORS, AuditUnavailable, ClaimLost, Flight, Interrupted
from gateway.tools.runtimes import transport
from gateway.tools.runtimes.base import (
    AnswerLost,
    CallContext,
    OnDispatch,
    Refused,
    TaskFailed,
    ToolError,
    UpstreamError,
    freeze_for_test,
)
from gateway.tools.shaping import shape
from gateway.tools.tool import ArgumentError, Tool, arguments_digest

log = logging.getLogger("pvegate.pipeline")


class UnknownTool(Exception):
    """The named tool is not in the catalog (a protocol-level error)."""


# An unknown tool's name is the client's own text, audited and echoed before any quota or policy
# applies, for any authenticated principal: only this much of it is kept (no tool is named longer).
TOOL_NAME_SHOWN_MAX = 200


def shown_tool_name(name: str) -> str:
    """The name as the audit and the reply quote it: cut to TOOL_NAME_SHOWN_MAX characters and
    marked with its length (a name already cut is kept as it is: the marker fits the slack)."""
    if len(name) <= TOOL_NAME_SHOWN_MAX + 32:
        return name
    return f"{name[:TOOL_NAME_SHOWN_MAX]}…[{len(name)} characters]"


def request_facts(req: CallRequest, method: str = "tools/call") -> dict[str, Any]:
    now_ns = time.time_ns()
    now = datetime.fromtimestamp(now_ns / 1e9, tz=UTC)
    return {
        "id": req.request_id,
        "method": method,
        "protocol_version": req.protocol_version,
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "time_ns": now_ns,
        "weekday": now.strftime("%a"),
        "hour_utc": now.hour,
        "source_ip": req.source_ip,
    }


async def call_tool(c: Components, req: CallRequest) -> CallResult:
    """resolve → validate → enrich → decide (one OPA query; an allowed allocating call into a pool is
    decided again under its pool hold) → audit → enforce → dispatch.

    Tracked while it runs (a drain waits for it); a failed audit write anywhere before
    dispatch becomes AuditUnavailable: a clear refusal, and nothing reaches Proxmox."""
    c.outcomes.check_store()  # nothing is asked or sent while the audit cannot take the records
    with c.outcomes.flight(req.request_id) as flight:
        hold = CallHold(c.holds, req.request_id)  # an allowed allocating call's hold on its pool (store/holds.py)
        ended = False
        try:
            result = await _call_tool(c, req, flight, hold)
            ended = True
            return _without_call_secrets(result)
        except (AuditUnavailable, *STORE_ERRORS) as exc:  # refused, and nothing was sent: retry it, it is not counted
            if not (flight.dispatched or flight.task_id is not None):
                await _give_back_quota(c, flight)
            if isinstance(exc, AuditUnavailable):
                raise
            raise c.outcomes.unavailable(exc) from exc
        finally:  # given back once Proxmox answered or nothing was sent; else when reconciliation settles it,
            # or (cut off by an error after it was sent) when it lapses
            sent = flight.dispatched or flight.task_id is not None
            await hold.end(keep=req.request_id in c.outcomes.unsettled or (sent and not ended))


async def _give_back_quota(c: Components, flight: Flight) -> None:
    """The quota slot of a call denied, or refused unsent (the store failed on its way: a 503 asks for a
    retry, which must not find the quota spent by the refusals); once. Best effort: a store that cannot
    give it back now keeps it (the slot lapses with its window)."""
    slot, flight.quota_slot = flight.quota_slot, None
    if slot is None:
        return
    try:
        await c.usage.release(*slot)
    except STORE_ERRORS as exc:
        log.warning("quota slot of %s not given back: %s", flight.request_id, exc)


def _without_call_secrets(result: CallResult) -> CallResult:
    """A refusal's or failure's reply without the call's secret values: an error text quotes what
    Proxmox (or a proxy, or a node's shell) answered, which may echo what it was sent, and the reply
    reaches the model's context and its logs like any tool result. The audit scrubs the same values."""
    secrets = CALL_SECRETS.get()
    if not result.is_error or not secrets:
        return result
    scrub = Scrubber(secrets)
    structured = result.structured
    if structured is not None:
        structured = json.loads(scrub.json_text(structured, scrub.needles()))
    return dataclasses.replace(result, text=scrub(result.text) or "", structured=structured)


async def _call_tool(c: Components, req: CallRequest, flight: Flight, hold: CallHold) -> CallResult:
    started = time.perf_counter()
    tool = c.catalog.get(req.tool)
    if tool is None:
        await _refuse(c, req, req.tool, None, "unknown_tool", None)
        raise UnknownTool(shown_tool_name(req.tool))
    CALL_SECRETS.set(())
    try:
        args = tool.validate(req.arguments)
        c.runtime(tool).check(tool, args)  # e.g. a property string given in part: refused before any decision
        # taken from validated arguments only (an invalid call's refusal never quotes a value), and
        # scrubbed from every record of this call as data: they never rewrite its principal or its JSON
        CALL_SECRETS.set(secret_values(tool.sensitive, args))
        cluster = c.cluster_for(tool, args)
    except (ArgumentError, Refused) as exc:
        await _refuse(c, req, tool.name, None, "invalid", str(exc))
        return CallResult("invalid", str(exc), is_error=True)

    version = await c.targets.version_refusal(tool, cluster)  # a 9.x-only tool on an 8.x cluster, ...
    if version is not None:
        outcome, why = version
        await _refuse(c, req, tool.name, None, outcome, why)
        return CallResult("invalid" if outcome == "unsupported_version" else "failed", why, is_error=True)

    # only a JSON true asks for a dry run (the MCP layer refuses any other non-boolean value first)
    dry_run = req.meta.get("dry_run", False) is True
    digest = arguments_digest(tool.name, args, dry_run=dry_run, sensitive=tool.sensitive)
    try:
        target = await c.targets.resolve(tool, args, cluster)
    except UpstreamError as exc:  # no facts to decide on: not a policy deny, and nothing was sent
        await _refuse(c, req, tool.name, None, "upstream_error", str(exc))
        return CallResult("failed", f"{tool.name} failed: {exc}", is_error=True)
    approval, refusal = await c.approvals.redeem(
        req.meta, req.principal, tool.name, digest, target, request_id=req.request_id
    )
    if refusal:
        waiting = await c.approvals.waiting(req.meta, req.principal, tool.name, digest, target)
        if waiting is not None:  # retried before the approver voted: still held, the same approval
            await _refuse(c, req, tool.name, target, "approval_pending", refusal)
            return c.approvals.held(waiting, tool.name, waiting.reason, [])
        await _refuse(c, req, tool.name, target, "approval_refused", refusal)
        return CallResult("denied", refusal, is_error=True)
    usage, slot = await c.usage.reserve(req.principal.sub, tool.name)  # counts and slot in one step: no racing quotas
    flight.quota_slot = (req.principal.sub, tool.name, slot)
    input_doc = policy_input(req, tool, args, digest, target, approval, usage, dry_run)
    if tool.allocates:  # creates, attaches, grows: the requested resources and the pool's usage
        input_doc["resources"] = await c.targets.resources(tool, args, cluster, target)
    m = c.metrics
    t = time.perf_counter()
    decision = await c.decisions.decide(input_doc)
    if tool.allocates and _into_a_pool(input_doc) and _will_send(decision, dry_run):
        # allowed: what it asks for is held on its pool, and it is decided again with the holds of the
        # calls allowed before it (store/holds.py); only an allowed call holds, so none blocks another
        try:
            input_doc["resources"] = await c.targets.resources(tool, args, cluster, target, hold.take)
        except HoldsUnavailable as exc:  # nothing decided on, nothing sent: this call is refused
            await _give_back_quota(c, flight)
            await _unspent(c, req, tool.name, target, approval, f"holds unavailable: {exc}")
            await _refuse(c, req, tool.name, target, "holds_unavailable", str(exc))
            return CallResult("failed", f"{tool.name} refused: {exc}", is_error=True)
        decision = await c.decisions.decide(input_doc)
    t = m.observe("decide", t)
    m.decision["failed_closed" if decision.failed_closed else _outcome(decision)].inc()
    owner = await _audit_decision(c, req, tool, args, target, decision, input_doc)  # durable before Proxmox hears of it
    m.observe("audit", t)

    if decision.approval_required:  # a held call counts toward quotas: no flooding the approvers
        await _unspent(c, req, tool.name, target, approval, "the decision asks for an approval again")
        return await c.approvals.pending_result(req, tool, args, digest, target, decision)
    if not decision.allow:
        await _give_back_quota(c, flight)
        reasons = list(decision.deny)
        await _unspent(c, req, tool.name, target, approval, "denied by policy: " + "; ".join(reasons))
        # the sentences for the model and humans; the codes and rules for clients that key on them
        denial = {
            "allowed": False,
            "reasons": reasons,
            "codes": decision.deny_codes,
            "denials": list(decision.deny_reasons),
        }
        return CallResult("denied", "Denied by policy: " + "; ".join(reasons), structured=denial, is_error=True)
    # the requests this call sends to Proxmox are this principal's: they take at most its share of the pool
    transport.CALLER.set(req.principal.sub)
    ctx = CallContext(
        cluster,
        dry_run=dry_run or bool(decision.obligations.get("dry_run")),
        request_id=req.request_id,
        on_dispatch=_dispatch_recorder(c, req, tool, target, flight),
        before_send=functools.partial(c.outcomes.hold, owner),  # a replica paused too long sends nothing
    )
    if tool.effect != "read" and not ctx.dry_run:
        try:
            c.outcomes.check_store()  # room for the dispatch and result records, or nothing is sent
        except AuditUnavailable as exc:
            await _refused_unsent(c, req, tool.name, target, exc)
            await _unspent(c, req, tool.name, target, approval, str(exc), store_failing=True)
            raise
    return await dispatch(c, req, tool, args, target, ctx, decision, started, flight, approval)


def _into_a_pool(input_doc: dict[str, Any]) -> bool:
    """The allocating call names a pool: there is something to hold (a pool limit needs one)."""
    return isinstance((input_doc.get("resources") or {}).get("pool"), str)


def _will_send(decision: Decision, dry_run: bool) -> bool:
    """The decision lets the call reach Proxmox as it is: allowed, not held for approval, no dry run."""
    return decision.allow and not decision.approval_required and not (dry_run or decision.obligations.get("dry_run"))


def _dispatch_recorder(
    c: Components, req: CallRequest, tool: Tool, target: dict[str, Any], flight: Flight
) -> OnDispatch:
    async def record(info: dict[str, Any]) -> None:
        """Proxmox accepted the mutation (its UPID) or the SSH command started: durable before the wait.
        If the store cannot take it now, it is kept and written later (reconciliation covers a crash)."""
        flight.dispatched = True
        flight.task_id = info.get("task_id")
        outcome = "accepted" if "task_id" in info else "started"
        rec = AuditRecord(req.request_id, "dispatch", req.principal.sub, tool.name, _tkey(target), outcome, info)
        await c.outcomes.settle(rec)
        c.outcomes.counters.dispatch_records += 1

    return record


def policy_input(
    req: CallRequest,
    tool: Tool,
    args: dict[str, Any],
    digest: str,
    target: dict[str, Any],
    approval: dict[str, Any] | None,
    usage: dict[str, dict[str, int]],
    dry_run: bool,
) -> dict[str, Any]:
    """The one document OPA decides on (docs/policy-contract.md)."""
    return {
        "contract_version": CONTRACT_VERSION,
        "kind": "call",
        "principal": req.principal.as_input(),
        "request": request_facts(req),
        "tool": tool.policy_view,
        "arguments": args,
        "arguments_digest": digest,
        "target": target,
        "approval": approval,
        "usage": usage,
        "dry_run": dry_run,
    }


async def dispatch(
    c: Components,
    req: CallRequest,
    tool: Tool,
    args: dict[str, Any],
    target: dict[str, Any],
    ctx: CallContext,
    decision: Decision,
    started: float,
    flight: Flight | None = None,
    approval: dict[str, Any] | None = None,
) -> CallResult:
    """Run an allowed call through its connector, shape the output, audit the result (and give back
    the call's quota slot and `approval` if the runtime refused it before anything was sent).

    After the connector ran, Proxmox may have acted: result records go through
    `outcomes.settle`, which keeps them for a later write if the store is full, and
    the client still learns the outcome."""
    m = c.metrics
    t = time.perf_counter()
    flight = flight or Flight(req.request_id)
    if c.outcomes.cutting:  # the drain cut off the calls in flight before this one left: known unsent
        return await _cut_unsent(c, req, tool.name, target, flight, approval)
    try:
        output = await c.outcomes.run(flight, c.runtime(tool).call(tool, args, ctx))
    except Refused as exc:  # nothing was sent: a refusal, not a failure
        m.observe("dispatch", t)
        await _refuse(c, req, tool.name, target, "refused", str(exc))
        if not (flight.dispatched or flight.task_id):  # a composite's later leaf refused: earlier ones ran
            await _give_back_quota(c, flight)
        await _unspent(c, req, tool.name, target, approval, f"refused by the runtime: {exc}")
        return CallResult("invalid", f"{tool.name} refused: {exc}", is_error=True)
    except Interrupted as exc:
        return await _interrupted(c, req, tool, target, ctx, started, flight, str(exc))
    except AuditUnavailable as exc:  # from before_send (ClaimLost too): nothing was sent, the call is refused
        await _refused_unsent(c, req, tool.name, target, exc)
        await _unspent(c, req, tool.name, target, approval, str(exc), store_failing=not isinstance(exc, ClaimLost))
        raise
    except ToolError as exc:
        t = m.observe("dispatch", t)
        m.upstream_error(ctx.cluster, tool.connector, exc)
        if flight.task_id and not isinstance(exc, TaskFailed):  # accepted, then contact lost: outcome unknown
            return await _interrupted(
                c, req, tool, target, ctx, started, flight, f"lost contact with Proxmox while waiting ({exc})"
            )
        if isinstance(exc, AnswerLost) and tool.effect != "read" and not ctx.dry_run:  # sent; did it run?
            flight.dispatched = True
            return await _interrupted(
                c, req, tool, target, ctx, started, flight, f"the request was sent but its answer was lost ({exc})"
            )
        outcome = "upstream_error" if isinstance(exc, UpstreamError) else "failed"
        kept = await _audit_result(
            c, req, tool, target, outcome, started, {"error": str(exc), "task_id": flight.task_id}
        )
        m.observe("audit", t)
        # Proxmox could not be asked, and nothing else ran (a composite's earlier leaves may have): nothing
        # was carried out, so neither the quota slot nor the approval is spent (a retry may present it again)
        if isinstance(exc, UpstreamError) and tool.connector != "composite" and not flight.dispatched:
            await _give_back_quota(c, flight)
            await _unspent(c, req, tool.name, target, approval, f"Proxmox could not be asked: {exc}")
        return CallResult("failed", f"{tool.name} failed: {exc}", is_error=True, meta=_kept_meta(kept))
    except Exception as exc:  # a bug after the decision: the request may have reached Proxmox, so say so
        await _audit_result(
            c,
            req,
            tool,
            target,
            "failed",
            started,
            {"error": f"internal error ({type(exc).__name__})", "task_id": flight.task_id},
        )
        raise
    m.observe("dispatch", t)
    if tool.secret_output:  # a one-time secret from Proxmox: scrubbed from every record of this call
        CALL_SECRETS.set(CALL_SECRETS.get() + secret_values(tool.secret_output, output.data))
    try:
        structured, warnings = shape(tool, output.data, decision.obligations)
        if warnings or output.warnings:
            structured["warnings"] = output.warnings + warnings
        text = c.render(tool, structured)
    except Exception as exc:  # output the node chose (a guest's, through pct exec) broke shaping
        # the call ran: its result is recorded as such, and its output withheld rather than half-shaped
        problem = f"it ran, but its output could not be shaped for the reply ({type(exc).__name__})"
        kept = await _audit_result(c, req, tool, target, "ok", started, {"task_id": output.task_id, "error": problem})
        return CallResult("failed", f"{tool.name}: {problem}", is_error=True, meta=_kept_meta(kept))
    body = {"task_id": output.task_id, "warnings": structured.get("warnings")}
    outcome = "ok"
    if output.task_running and tool.effect != "read" and not ctx.dry_run:
        # Proxmox still runs it (its task_timeout passed): not settled, so reconciliation records how
        # it ends (`reconciled`, proxmox ok or failed); an `ok` here would stand for a task that fails
        outcome, body["pending_reconcile"] = "running", True
        c.outcomes.unsettled.add(req.request_id)
    t = time.perf_counter()
    kept = await _audit_result(c, req, tool, target, outcome, started, body)
    m.observe("audit", t)
    return CallResult("allowed", text, structured=structured, meta=_kept_meta(kept))


def _kept_meta(kept: bool) -> dict[str, Any]:
    if not kept:
        return {}
    return {"pvegate/audit": "kept: the audit store could not take this result yet; it is written as soon as it can"}


async def _interrupted(
    c: Components,
    req: CallRequest,
    tool: Tool,
    target: dict[str, Any],
    ctx: CallContext,
    started: float,
    flight: Flight,
    reason: str,
) -> CallResult:
    """Cut off, or the outcome unknown: say what is known (the UPID) and leave it to reconciliation."""
    mutation = tool.effect != "read" and not ctx.dry_run
    body = {"reason": reason, "task_id": flight.task_id, "dispatched": flight.dispatched, "pending_reconcile": mutation}
    c.outcomes.counters.interrupted += 1
    c.metrics.interrupted()
    await _audit_result(c, req, tool, target, "interrupted", started, body)
    if mutation:
        c.outcomes.unsettled.add(req.request_id)  # settled from Proxmox by the reconciliation loop
    if mutation and flight.task_id:
        text = (
            f"{tool.name} interrupted: {reason}. Proxmox accepted it as task {flight.task_id}, which may still be "
            "running; poll get_task_status with that upid. The gateway records its outcome from Proxmox."
        )
    elif mutation and flight.dispatched:
        text = f"{tool.name} interrupted: {reason}. The request was sent; its outcome is recorded from Proxmox."
    elif mutation:
        text = f"{tool.name} interrupted: {reason}. It may or may not have reached Proxmox; recorded from Proxmox."
    else:
        text = f"{tool.name} interrupted: {reason}. A read: nothing changed."
    return CallResult("interrupted", text, structured={"interrupted": True, "task_id": flight.task_id}, is_error=True)


SHUT_DOWN_UNSENT = "the gateway is shutting down and sent nothing to Proxmox; retry shortly (on any replica)"


async def _cut_unsent(
    c: Components, req: CallRequest, tool: str, target: dict[str, Any], flight: Flight, approval: dict[str, Any] | None
) -> CallResult:
    """Reached the connector after a drain's cut-off (Outcomes.cut), so never sent: a refusal, not an
    `interrupted` call whose outcome reconciliation must look for in Proxmox. Its record closes it
    (`sent: false`), and its quota slot and approval are given back for the retry it is asked to make
    (an approval left spent here was "already used" on that retry, though nothing ever ran)."""
    body = {"error": SHUT_DOWN_UNSENT, "sent": False}
    await c.outcomes.settle(
        AuditRecord(req.request_id, "refusal", req.principal.sub, tool, _tkey(target), "refused", body)
    )
    await _give_back_quota(c, flight)
    await _unspent(c, req, tool, target, approval, SHUT_DOWN_UNSENT)
    return CallResult("failed", f"{tool} not run: {SHUT_DOWN_UNSENT}", structured={"sent": False}, is_error=True)


async def _unspent(
    c: Components,
    req: CallRequest,
    tool: str,
    target: dict[str, Any],
    approval: dict[str, Any] | None,
    why: str,
    store_failing: bool = False,
) -> None:
    """The call was refused before anything was sent: the approval it consumed (redeem) is given back, so
    the retry the refusal asks for can present it again. Once anything may have reached Proxmox (or an
    allowed dry run ran) it stays used; a crash before this leaves it used too (docs/approvals.md). So
    does a store that is failing (it would not take the give-back, and the client's 503 must not wait on
    it): used is the safe side, a retry is refused, never run twice."""
    if approval is None or store_failing:
        return
    try:
        await c.approvals.release(approval["id"], req.principal, tool, target, req.request_id, why)
    except STORE_ERRORS as exc:  # the refusal stands as it was; the approval stays used
        log.warning(
            "approval %s: its give-back after request %s was refused failed or was not recorded: %r",
            approval["id"],
            req.request_id,
            exc,
        )


async def _refuse(
    c: Components, req: CallRequest, tool: str, target: dict[str, Any] | None, outcome: str, error: str | None
) -> None:
    body = {"error": error} if error is not None else None
    tkey = _tkey(target) if target is not None else None
    await c.audit.append(
        AuditRecord(req.request_id, "refusal", req.principal.sub, shown_tool_name(tool), tkey, outcome, body)
    )


async def _audit_decision(
    c: Components,
    req: CallRequest,
    tool: Tool,
    args: dict[str, Any],
    target: dict[str, Any],
    decision: Decision,
    input_doc: dict[str, Any],
) -> str | None:
    """received + decision, committed together before anything reaches Proxmox; the replica name
    the decision was recorded under (PostgreSQL), which must still be this process's when it sends."""
    who, tkey = req.principal.sub, _tkey(target)
    kept_args = audit_arguments(tool, args, decision.obligations.get("redact"))
    received = {
        "arguments": kept_args,
        "target": target,
        "protocol": req.protocol_version,
        "effect": tool.effect,  # reconciliation: a read changed nothing
        "dry_run": bool(input_doc["dry_run"] or decision.obligations.get("dry_run")),
    }
    outcome = _outcome(decision)
    body = _decision_body(decision, input_doc)
    # the whole input, as the audit may keep it, so `pvegate policy replay` can ask a candidate policy
    body["input_redacted"] = redacted_paths(args, kept_args)
    replayable = {**input_doc, "arguments": kept_args}
    if body["input_redacted"]:  # digests of what is kept: a digest over a hidden value would give it away
        replayable["arguments_digest"] = arguments_digest(tool.name, kept_args, dry_run=bool(input_doc["dry_run"]))
        body["input_digest"] = digest_json(replayable)
    owner = await c.audit.append(
        AuditRecord(req.request_id, "received", who, tool.name, tkey, None, received),
        AuditRecord(req.request_id, "decision", who, tool.name, tkey, outcome, body, policy_input=replayable),
    )
    if tool.effect != "read":
        freeze_for_test("stop-after-decision")  # tests only: frozen between the decision and the store check
    return owner


async def _refused_unsent(
    c: Components, req: CallRequest, tool: str, target: dict[str, Any], exc: AuditUnavailable
) -> None:
    """A mutation decided, then refused before anything was sent (the store cannot take the records
    that would follow, or this replica lost its claim): its refusal closes it in the audit. Written
    through the outbox, so it waits for a store that is away; known unsent, it is never matched against
    Proxmox's tasks (a crash before the write leaves it to the start-up reconciliation)."""
    body = {"error": str(exc), "sent": False}
    rec = AuditRecord(req.request_id, "refusal", req.principal.sub, tool, _tkey(target), "refused", body)
    if isinstance(exc, ClaimLost):  # the store answers (it said the name is gone): written now
        await c.outcomes.settle(rec)
    else:  # the store is failing: kept for the flusher, so the client's 503 never waits on it
        c.outcomes.keep(rec)


def _outcome(decision: Decision) -> str:
    return "allow" if decision.allow else "pending" if decision.approval_required else "deny"


def _tkey(target: dict[str, Any]) -> str | None:
    if target.get("vmid") is not None:
        return f"{target['cluster']}/{target.get('type') or 'guest'}/{target['vmid']}"
    if target.get("node"):
        return f"{target['cluster']}/node/{target['node']}"
    return target.get("cluster")


def _decision_body(d: Decision, input_doc: dict[str, Any]) -> dict[str, Any]:
    return {
        **d.as_dict(),
        "approval_presented": (input_doc["approval"] or {}).get("id"),
        "input_digest": digest_json(input_doc),
        "eval_ns": d.eval_ns,
    }


async def _audit_result(
    c: Components,
    req: CallRequest,
    tool: Tool,
    target: dict[str, Any],
    outcome: str,
    started: float,
    body: dict[str, Any],
) -> bool:
    """Write the result record (or keep it for later); True if it had to be kept."""
    body["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
    rec = AuditRecord(req.request_id, "result", req.principal.sub, tool.name, _tkey(target), outcome, body)
    return not await c.outcomes.settle(rec)
