"""The hot path: one tools/call from authenticated principal to audited result.

resolve tool → validate arguments → enrich (target, approval, usage) → one OPA
query → enforce → dispatch → shape → audit. The gateway decides nothing here:
it builds the input, asks OPA once, and does what the answer says.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from gateway.components import Components
from gateway.core.calls import CallRequest, CallResult
from gateway.core.canonical import digest_json
from gateway.policy.decisions import CONTRACT_VERSION, Decision
from gateway.store.audit import CALL_SECRETS, AuditRecord, audit_arguments, redacted_paths, secret_values
from gateway.tools.runtimes.base import CallContext, Refused, ToolError, UpstreamError
from gateway.tools.shaping import shape
from gateway.tools.tool import ArgumentError, Tool, arguments_digest


class UnknownTool(Exception):
    """The named tool is not in the catalog (a protocol-level error)."""


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
    """resolve → validate → enrich → decide (one OPA query) → audit → enforce → dispatch."""
    started = time.perf_counter()
    tool = c.catalog.get(req.tool)
    if tool is None:
        await _refuse(c, req, req.tool, None, "unknown_tool", None)
        raise UnknownTool(req.tool)
    CALL_SECRETS.set(secret_values(tool.sensitive, req.arguments))  # scrubbed from every record of this call
    try:
        args = tool.validate(req.arguments)
        cluster = c.cluster_for(tool, args)
    except ArgumentError as exc:
        await _refuse(c, req, tool.name, None, "invalid", str(exc))
        return CallResult("invalid", str(exc), is_error=True)

    dry_run = bool(req.meta.get("dry_run", False))
    digest = arguments_digest(tool.name, args, dry_run=dry_run)
    try:
        target = await c.targets.resolve(tool, args, cluster)
    except UpstreamError as exc:  # no facts to decide on: not a policy deny, and nothing was sent
        await _refuse(c, req, tool.name, None, "upstream_error", str(exc))
        return CallResult("failed", f"{tool.name} failed: {exc}", is_error=True)
    approval, refusal = await c.approvals.redeem(
        req.meta, req.principal, tool.name, digest, target, request_id=req.request_id
    )
    if refusal:
        await _refuse(c, req, tool.name, target, "approval_refused", refusal)
        return CallResult("denied", refusal, is_error=True)
    usage, slot = c.usage.reserve(req.principal.sub, tool.name)  # counts and slot in one step: no racing quotas
    input_doc = policy_input(req, tool, args, digest, target, approval, usage, dry_run)
    if tool.allocates:  # creates, attaches, grows: the requested resources and the pool's usage
        input_doc["resources"] = await c.targets.resources(tool, args, cluster, target)
    m = c.metrics
    t = time.perf_counter()
    decision = await c.decisions.decide(input_doc)
    t = m.observe("decide", t)
    m.decision["failed_closed" if decision.failed_closed else _outcome(decision)].inc()
    await _audit_decision(c, req, tool, args, target, decision, input_doc)  # durable before Proxmox hears of it
    m.observe("audit", t)

    if decision.approval_required:  # a held call counts toward quotas: no flooding the approvers
        return await c.approvals.pending_result(req, tool, args, digest, target, decision)
    if not decision.allow:
        c.usage.release(req.principal.sub, tool.name, slot)
        reasons = list(decision.deny)
        # the sentences for the model and humans; the codes and rules for clients that key on them
        denial = {
            "allowed": False,
            "reasons": reasons,
            "codes": decision.deny_codes,
            "denials": list(decision.deny_reasons),
        }
        return CallResult("denied", "Denied by policy: " + "; ".join(reasons), structured=denial, is_error=True)
    ctx = CallContext(cluster, dry_run=dry_run or bool(decision.obligations.get("dry_run")), request_id=req.request_id)
    return await dispatch(c, req, tool, args, target, ctx, decision, started)


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
) -> CallResult:
    """Run an allowed call through its connector, shape the output, audit the result."""
    m = c.metrics
    t = time.perf_counter()
    try:
        output = await c.runtime(tool).call(tool, args, ctx)
    except Refused as exc:  # nothing was sent: a refusal, not a failure
        m.observe("dispatch", t)
        await _refuse(c, req, tool.name, target, "refused", str(exc))
        return CallResult("invalid", f"{tool.name} refused: {exc}", is_error=True)
    except ToolError as exc:
        t = m.observe("dispatch", t)
        m.upstream_error(ctx.cluster, tool.connector, exc)
        outcome = "upstream_error" if isinstance(exc, UpstreamError) else "failed"
        await _audit_result(c, req, tool, target, outcome, started, {"error": str(exc)})
        m.observe("audit", t)
        return CallResult("failed", f"{tool.name} failed: {exc}", is_error=True)
    except Exception as exc:  # a bug after the decision: the request may have reached Proxmox, so say so
        await _audit_result(
            c, req, tool, target, "failed", started, {"error": f"internal error ({type(exc).__name__})"}
        )
        raise
    m.observe("dispatch", t)
    structured, warnings = shape(tool, output.data, decision.obligations)
    if warnings or output.warnings:
        structured["warnings"] = output.warnings + warnings
    body = {"task_id": output.task_id, "warnings": structured.get("warnings")}
    t = time.perf_counter()
    await _audit_result(c, req, tool, target, "ok", started, body)
    m.observe("audit", t)
    return CallResult("allowed", c.render(tool, structured), structured=structured)


async def _refuse(
    c: Components, req: CallRequest, tool: str, target: dict[str, Any] | None, outcome: str, error: str | None
) -> None:
    body = {"error": error} if error is not None else None
    tkey = _tkey(target) if target is not None else None
    await c.audit.append(AuditRecord(req.request_id, "refusal", req.principal.sub, tool, tkey, outcome, body))


async def _audit_decision(
    c: Components,
    req: CallRequest,
    tool: Tool,
    args: dict[str, Any],
    target: dict[str, Any],
    decision: Decision,
    input_doc: dict[str, Any],
) -> None:
    """received + decision, committed together before anything reaches Proxmox."""
    who, tkey = req.principal.sub, _tkey(target)
    kept_args = audit_arguments(tool, args, decision.obligations.get("redact"))
    received = {"arguments": kept_args, "target": target, "protocol": req.protocol_version}
    outcome = _outcome(decision)
    body = _decision_body(decision, input_doc)
    # the whole input, as the audit may keep it, so `pvegate policy replay` can ask a candidate policy
    body["input_redacted"] = redacted_paths(args, kept_args)
    replayable = {**input_doc, "arguments": kept_args}
    await c.audit.append(
        AuditRecord(req.request_id, "received", who, tool.name, tkey, None, received),
        AuditRecord(req.request_id, "decision", who, tool.name, tkey, outcome, body, policy_input=replayable),
    )


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
        "allow": d.allow,
        "deny": list(d.deny),
        "deny_codes": d.deny_codes,
        "deny_reasons": list(d.deny_reasons),
        "risk": d.risk,
        "approval": d.approval,
        "approval_presented": (input_doc["approval"] or {}).get("id"),
        "obligations": d.obligations,
        "quota": d.quota,
        "decision_id": d.decision_id,
        "bundle_revision": d.revision,
        "failed_closed": d.failed_closed,
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
) -> None:
    body["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
    await c.audit.append(
        AuditRecord(req.request_id, "result", req.principal.sub, tool.name, _tkey(target), outcome, body)
    )
