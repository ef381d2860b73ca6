"""The fast decision check (fastjsonschema) and jsonschema give the same verdict on every document.

The gateway accepts a decision when the compiled check accepts it, so any document the
reference validator refuses but the compiled one accepts would be a hole. The mutations
below change, drop or add every field of three real-shaped decisions, one at a time.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema
import pytest

from gateway.policy.decisions import DecisionClient
from tests.support import ALLOWING_DECISION

ALLOW: dict[str, Any] = ALLOWING_DECISION
PENDING: dict[str, Any] = {
    **ALLOW,
    "allow": False,
    "risk": {"score": 60, "level": "high", "factors": [{"name": "target_tag:prod", "points": 30, "why": "prod"}]},
    "approval": {
        "required": True,
        "satisfied": False,
        "approver_groups": ["ops-approvers"],
        "min_approvals": 1,
        "ttl_seconds": 900,
        "reason": "high risk",
        "reasons": [
            {"code": "approval.risk_level", "rule": "data.approval.required_from_level", "message": "high risk"}
        ],
    },
    "obligations": {"dry_run": True, "redact": ["config.cipassword", "rows.*.env"], "max_items": 100},
}
DENY: dict[str, Any] = {
    **ALLOW,
    "allow": False,
    "deny": ['quota "calls" exceeded'],
    "deny_reasons": [{"code": "quota.exceeded", "rule": "data.quotas[calls]", "message": 'quota "calls" exceeded'}],
    "quota": {"name": "calls", "limit": 120, "window": "1m", "resets_in_seconds": 12},
}

REPLACEMENTS: list[Any] = [None, True, False, 0, 1, -1, 1.0, 1.5, 101, "", "x", "a..b", [], ["x"], ["x", "x"], {}]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return copy.deepcopy(value)
    out = copy.deepcopy(doc)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


def _mutations() -> Iterator[Any]:
    for base in (ALLOW, PENDING, DENY):
        yield base
        for path in _paths(base):
            for value in REPLACEMENTS:
                yield _set(base, path, value)
            if path:
                parent = _set(base, (), base)
                node = parent
                for p in path[:-1]:
                    node = node[p]
                if isinstance(node, dict):
                    del node[path[-1]]
                    yield parent
            target = _set(base, (), base)
            node = target
            for p in path:
                node = node[p]
            if isinstance(node, dict):
                node["extra"] = 1
                yield target


@pytest.fixture(scope="module")
def client() -> DecisionClient:
    return DecisionClient("http://127.0.0.1:9")  # never asked: only its contract check is used


def test_compiled_and_reference_validators_agree(client: DecisionClient) -> None:
    schema = json.loads(resources.files("gateway.schemas").joinpath("decision.schema.json").read_text())
    reference = jsonschema.Draft202012Validator(schema)
    docs = list(_mutations())
    assert len(docs) > 1000
    accepted = 0
    for doc in docs:
        ok = client.contract_problem(doc) is None
        assert ok == reference.is_valid(doc), json.dumps(doc)
        accepted += ok
    assert 3 <= accepted < len(docs) // 2  # both verdicts occur


def test_refusal_names_where_the_contract_breaks(client: DecisionClient) -> None:
    problem = client.contract_problem(_set(ALLOW, ("risk", "level"), "extreme"))
    assert problem is not None and problem.startswith("decision does not match the contract at risk/level")


def test_an_approval_lifetime_past_ten_years_breaks_the_contract(client: DecisionClient) -> None:
    """Its expiry is written as a date: a lifetime past what one holds failed every held call (stop 49)."""
    assert client.contract_problem(_set(PENDING, ("approval", "ttl_seconds"), 315_360_000)) is None
    problem = client.contract_problem(_set(PENDING, ("approval", "ttl_seconds"), 10**12))
    assert problem is not None and "approval/ttl_seconds" in problem, problem
