"""The label values docs/deployment.md's metric table names are the ones the gateway emits:
pvegate_call_seconds{outcome} and pvegate_upstream_errors_total{reason}, read off the table and
off the code (every outcome a tools/call ends with, every cause an UpstreamError is raised with)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gateway.observability.metrics import CALL_OUTCOMES, UPSTREAM_REASONS

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"


def _documented(metric: str, label: str) -> set[str]:
    """The values listed as `label` (a, b, c) in the metric table row of `metric`."""
    table = (ROOT / "docs" / "deployment.md").read_text()
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| `{metric}` |"))
    labels = row.split("|")[3]
    found = re.search(rf"`{label}` \(([^)]*)\)", labels)
    assert found, f"docs/deployment.md: {metric}'s `{label}` lists no values: {labels}"
    return {v.strip() for v in found.group(1).split(",")}


def _trees() -> list[ast.Module]:
    return [ast.parse(p.read_text(), str(p)) for p in sorted(GATEWAY.rglob("*.py"))]


def _str(node: ast.AST) -> set[str]:
    """The string constants an argument can be (a conditional expression: both branches)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _str(node.body) | _str(node.orelse)
    return set()


def _name(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _emitted_outcomes() -> set[str]:
    """A CallResult's outcome anywhere, and what mcp/methods.py's _run sets `outcome` to."""
    found: set[str] = set()
    for tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "CallResult" and node.args:
                found |= _str(node.args[0])
    methods = ast.parse((GATEWAY / "mcp" / "methods.py").read_text())
    run = next(n for n in ast.walk(methods) if isinstance(n, ast.AsyncFunctionDef) and n.name == "_run")
    for node in ast.walk(run):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "outcome" for t in node.targets):
            found |= _str(node.value)
    return found


def _upstream_causes() -> set[str]:
    """Every cause an UpstreamError (or a subclass, through super().__init__) is made with."""
    found: set[str] = set()
    for tree in _trees():
        subclasses = {
            c.name
            for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef) and any(_name(b) == "UpstreamError" for b in c.bases)
        }
        for cls in (c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.name in subclasses):
            for node in ast.walk(cls):
                if isinstance(node, ast.Call) and _name(node.func) == "__init__" and len(node.args) >= 2:
                    found |= _str(node.args[1])
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "UpstreamError" and len(node.args) >= 2:
                found |= _str(node.args[1])
    return found


def test_call_outcomes_documented_are_those_emitted() -> None:
    assert _documented("pvegate_call_seconds", "outcome") == set(CALL_OUTCOMES)
    emitted = _emitted_outcomes()
    assert {"allowed", "interrupted", "audit_unavailable", "unknown_tool", "error"} <= emitted  # the scan works
    assert emitted <= set(CALL_OUTCOMES), f"emitted but not in CALL_OUTCOMES: {emitted - set(CALL_OUTCOMES)}"


def test_upstream_reasons_documented_are_those_emitted() -> None:
    assert _documented("pvegate_upstream_errors_total", "reason") == set(UPSTREAM_REASONS)
    causes = _upstream_causes()
    assert {"unreachable", "tls", "auth", "circuit_open"} <= causes  # the scan works
    # upstream_reason: an UpstreamError's cause, else timeout or error
    assert causes | {"timeout", "error"} == set(UPSTREAM_REASONS)
