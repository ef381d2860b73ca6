"""Every outcome the gateway's code writes into the audit as a literal is one the record filter
(`GET /admin/audit/records?outcome=`) knows: a missing one was refused as a typo (400 "an outcome
the audit writes") until the first such record existed (found by a review: `withdraw_refused`,
`csrf_refused`, a what-if's `approval required`)."""

from __future__ import annotations

import ast
from pathlib import Path

from gateway.admin.api import AUDIT_OUTCOMES

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
# the calls that write an audit record, and the position of their outcome argument
OUTCOME_ARGUMENT = {"AuditRecord": 5, "_audit": 4, "record": 3}


def _literals(expr: ast.expr) -> list[str]:
    """The string constants an outcome expression can be: a literal, or the branches of a conditional."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return [expr.value]
    if isinstance(expr, ast.IfExp):
        return _literals(expr.body) + _literals(expr.orelse)
    if isinstance(expr, ast.BoolOp):
        return [s for v in expr.values for s in _literals(v)]
    return []


def _written() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name not in OUTCOME_ARGUMENT:
                continue
            at = OUTCOME_ARGUMENT[name]
            arg = (
                node.args[at]
                if len(node.args) > at
                else next((k.value for k in node.keywords if k.arg == "outcome"), None)
            )
            for outcome in _literals(arg) if arg is not None else []:
                found.setdefault(outcome, f"{path.relative_to(GATEWAY.parent)}:{node.lineno}")
    return found


def test_every_literal_outcome_is_one_the_filter_knows() -> None:
    written = _written()
    assert {"withdraw_refused", "csrf_refused", "consumed"} <= set(written)  # the scan sees the writers
    unknown = {o: where for o, where in written.items() if o not in AUDIT_OUTCOMES}
    assert not unknown, f"outcomes written but not in admin/api.py AUDIT_OUTCOMES: {unknown}"


def test_the_console_what_if_outcomes_are_known() -> None:
    # written through a variable (views.py: allow / approval required / deny), so named here
    assert {"allow", "approval required", "deny", "invalid"} <= AUDIT_OUTCOMES
