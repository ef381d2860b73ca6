"""The per-principal limits (store/principal_limits.py) at the MCP door: a call over its principal's
calls in flight or refusal budget is a JSON-RPC error (TOO_MANY_REQUESTS, data: reason,
retry_after_seconds; HTTP 429 with Retry-After in both protocol eras), and the faults a call raises
that its raiser audited (an unknown tool, a refused requestState) count against the budget."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from gateway.mcp.jsonrpc import INTERNAL_ERROR, URL_ELICITATION_REQUIRED, RpcFault
from gateway.store.principal_limits import Limited, PrincipalLimits

# JSON-RPC code in the implementation-defined band (store/outcomes.py has -32010 and -32011)
TOO_MANY_REQUESTS = -32012
HTTP_STATUS = 429


# faults audited as protocol_error that are not the client's refusal: an approval hand-off (a held call)
# and an internal error; they never count against the principal's refusal budget
NOT_REFUSALS = frozenset({URL_ELICITATION_REQUIRED, INTERNAL_ERROR})


def counts(fault: RpcFault | None) -> bool:
    """A protocol-level refusal that counts against its principal's refusal budget."""
    return fault is None or fault.code not in NOT_REFUSALS


class PrincipalLimited(RpcFault):
    """A call refused at its principal's door (counted in a summary row, not audited one by one)."""

    def __init__(self, limited: Limited) -> None:
        super().__init__(
            TOO_MANY_REQUESTS,
            limited.message,
            {"reason": limited.reason, "retry_after_seconds": limited.retry_after},
            audited=True,
            http_status=HTTP_STATUS,
            retry_after=limited.retry_after,
        )
        self.reason = limited.reason


@contextlib.asynccontextmanager
async def door(limits: PrincipalLimits, principal: str) -> AsyncIterator[None]:
    """One of the principal's call slots for the block, or PrincipalLimited; an audited fault the block
    raises counts as one of its refusals."""
    try:
        await limits.enter(principal)
    except Limited as exc:
        raise PrincipalLimited(exc) from None
    try:
        with counting(limits, principal):
            yield
    finally:
        limits.leave(principal)


@contextlib.contextmanager
def counting(limits: PrincipalLimits, principal: str) -> Iterator[None]:
    """Count a refusal when the block raises an RpcFault its raiser audited (an unknown tool, a refused
    requestState): the reply is the fault, the row is written."""
    try:
        yield
    except RpcFault as fault:
        if fault.audited and not isinstance(fault, PrincipalLimited):
            limits.refused(principal)
        raise
