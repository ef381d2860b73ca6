"""Approvals: pending requests and one-time, argument-bound approval tokens.

Walking-skeleton version: no approval store yet, so a call that needs approval is
refused (fail closed) and a presented token is refused. Replaced by the
four-eyes workflow (issue 6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.catalog import Tool
    from gateway.decisions import Decision
    from gateway.pipeline import CallRequest, CallResult

APPROVAL_META_KEY = "pvegate/approval"


class Approvals:
    async def redeem(
        self, meta: dict[str, Any], principal: Principal, tool: str, digest: str, target: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(approval facts for OPA, or None; refusal reason, or None)."""
        if meta.get(APPROVAL_META_KEY):
            return None, "approval tokens are not accepted by this gateway yet"
        return None, None

    async def pending_result(
        self,
        req: CallRequest,
        tool: Tool,
        args: dict[str, Any],
        digest: str,
        target: dict[str, Any],
        decision: Decision,
    ) -> CallResult:
        from gateway.pipeline import CallResult

        reason = decision.approval.get("reason") or "policy requires a human approval"
        return CallResult("denied", f"Denied: {reason}; approvals are not enabled on this gateway", is_error=True)

    async def close(self) -> None:
        return None
