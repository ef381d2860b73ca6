"""Which audit records settle an allowed call: the one condition reconciliation (store/reconcile.py) looks for
and archiving (store/audit.py, which never cuts past an open call) respects. A module of its own so both
read the same text without importing each other."""


def settles(request_id: str, seq: str) -> str:
    """The condition on `audit r` for a record after a call's decision that settles the call. An `upstream_error`
    result settles it too: Proxmox could not be asked (unreachable, TLS, its 401, an open circuit), nothing was
    sent, and a task-list search for it could only find another's task."""
    return f"""r.request_id = {request_id} AND r.seq > {seq} AND (
        r.kind = 'refusal'
        OR (r.kind = 'result' AND (
            r.outcome IN ('ok', 'failed', 'upstream_error', 'reconciled')
            OR (r.outcome = 'interrupted' AND r.body LIKE '%"pending_reconcile":false%'))))"""


# Allowed calls without a settling record decided in a time range (the decision's seq orders them): read by the
# `audit_ts` index, each call's records by `audit_request`.
OPEN_CALLS_SQL = f"""
SELECT d.seq, d.request_id, d.ts, d.principal, d.tool, d.target FROM audit d
WHERE d.kind = 'decision' AND d.outcome = 'allow' AND d.ts >= ? AND d.ts < ?
AND NOT EXISTS (SELECT 1 FROM audit r WHERE {settles("d.request_id", "d.seq")})
ORDER BY d.seq
"""  # noqa: S608 - fixed text
