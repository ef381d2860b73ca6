"""The policy contract against a live OPA server.

Every golden case in policies/golden/ is POSTed to a real `opa run --server`
(started through the gateway's own sidecar class, loading policies/ exactly as
the gateway does) and answered through the gateway's decision client, so the
Rego and the gateway cannot drift apart: each answer must validate against
gateway/schemas/decision.schema.json and meet the case's expectations. The same
cases run under `opa test` (policies/pvegate/golden/golden_test.rego).
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

from gateway.policy.decisions import DecisionClient
from gateway.policy.opa_sidecar import OPASidecar, find_opa
from tests.support import ALLOWING_DECISION

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
GOLDEN_DIR = POLICIES / "golden"
SCHEMAS = REPO / "gateway" / "schemas"


def _schema(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return doc


def _registry() -> Registry:
    resources = []
    for name in ("decision", "decision_input", "list_input", "approve_input"):
        doc = _schema(name)
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        _schema(name), registry=_registry(), format_checker=jsonschema.FormatChecker()
    )


def load_golden() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for path in sorted(GOLDEN_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        assert list(doc) == [path.stem], f"{path.name}: must hold one object keyed by its scenario name"
        case = doc[path.stem]
        assert case["name"] == path.stem
        cases.append((path.stem, case))
    return cases


GOLDEN = load_golden()


# the keys of a case and of its expect object (as golden_test.rego): any other is a typo that
# would leave part of the case unchecked, so it fails the case
CASE_KEYS = frozenset({"name", "description", "input", "expect"})
EXPECT_KEYS = frozenset(
    {
        "allow",
        "risk_level",
        "approval_required",
        "approval_satisfied",
        "approver_groups",
        "min_approvals",
        "quota",
        "deny_contains",
        "deny_empty",
        "obligations",
        "risk_factors_include",
        "approval_reason_contains",
        "deny_codes",
        "approval_codes",
    }
)


def case_problems(case: dict[str, Any]) -> list[str]:
    """Why a case cannot be compared as written; mirrors golden_test.rego's shape_problems."""
    problems = []
    if unknown := sorted(set(case) - CASE_KEYS):
        problems.append(f"unknown case keys {unknown} (known: {sorted(CASE_KEYS)})")
    if not isinstance(case.get("input"), dict):
        problems.append("the case has no input object")
    expect = case.get("expect")
    if not isinstance(expect, dict) or "allow" not in expect:
        problems.append("the case has no expect object stating allow")
    elif unknown := sorted(set(expect) - EXPECT_KEYS):
        problems.append(f"unknown expect keys {unknown} (known: {sorted(EXPECT_KEYS)})")
    return problems


def unmet(expect: dict[str, Any], d: dict[str, Any]) -> list[str]:
    """Expectations (partial) the decision d does not meet; mirrors golden_test.rego."""
    problems = []
    if unknown := sorted(set(expect) - EXPECT_KEYS):
        problems.append(f"unknown expect keys {unknown} (known: {sorted(EXPECT_KEYS)})")
    observed = {
        "allow": d["allow"],
        "risk_level": d["risk"]["level"],
        "approval_required": d["approval"]["required"],
        "approval_satisfied": d["approval"]["satisfied"],
        "approver_groups": d["approval"]["approver_groups"],
        "min_approvals": d["approval"]["min_approvals"],
        "quota": d["quota"],
    }
    for key, got in observed.items():
        if key in expect and expect[key] != got:
            problems.append(f"{key}: want {expect[key]!r}, got {got!r}")
    for frag in expect.get("deny_contains", []):
        if not any(frag in r for r in d["deny"]):
            problems.append(f"deny: no reason contains {frag!r}; got {d['deny']!r}")
    if expect.get("deny_empty") and d["deny"]:
        problems.append(f"deny: want none, got {d['deny']!r}")
    for key, want in expect.get("obligations", {}).items():
        if d["obligations"].get(key) != want:
            problems.append(f"obligations.{key}: want {want!r}, got {d['obligations'].get(key)!r}")
    names = {f["name"] for f in d["risk"]["factors"]}
    for name in expect.get("risk_factors_include", []):
        if name not in names:
            problems.append(f"risk factors: want {name!r} among {sorted(names)}")
    frag = expect.get("approval_reason_contains")
    if frag is not None and frag not in d["approval"]["reason"]:
        problems.append(f"approval.reason: want it to contain {frag!r}")
    for key, reasons in (("deny_codes", d["deny_reasons"]), ("approval_codes", d["approval"]["reasons"])):
        codes = sorted({r["code"] for r in reasons})
        problems += [f"{key}: want {code!r} among {codes}" for code in expect.get(key, []) if code not in codes]
    # whatever a case expects: the sentences are exactly the coded reasons' messages
    if d["deny"] != sorted({r["message"] for r in d["deny_reasons"]}):
        problems.append(f"deny {d['deny']!r} is not the messages of deny_reasons {d['deny_reasons']!r}")
    if d["approval"]["reason"] != "; ".join(sorted({r["message"] for r in d["approval"]["reasons"]})):
        problems.append(f"approval.reason is not the messages of approval.reasons {d['approval']['reasons']!r}")
    return problems


def _start(paths: tuple[Path, ...]) -> OPASidecar:
    sidecar = OPASidecar(policies=paths, decision_logs=False)
    sidecar.start(timeout=30.0)
    return sidecar


@pytest.fixture(scope="module")
def opa() -> Iterator[OPASidecar]:
    find_opa()  # a clear error when the binary is missing
    sidecar = _start((POLICIES,))
    yield sidecar
    sidecar.stop()


@pytest.fixture(scope="module")
def opa_without_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OPASidecar]:
    """The same policies with no policy data at all (no policies/data/)."""
    root = tmp_path_factory.mktemp("policies-no-data")
    for rego in POLICIES.rglob("*.rego"):
        if rego.name.endswith("_test.rego"):
            continue
        dest = root / rego.relative_to(POLICIES)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(rego, dest)
    sidecar = _start((root,))
    yield sidecar
    sidecar.stop()


def post(sidecar: OPASidecar, path: str, input_doc: Any) -> dict[str, Any]:
    with sidecar.client(timeout=10) as c:
        r = c.post(f"/v1/data/{path}", params={"metrics": "true"}, json={"input": input_doc})
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    assert "result" in body, f"data.{path.replace('/', '.')} is undefined"
    return body


def test_golden_cases_exist() -> None:
    assert len(GOLDEN) >= 20


def test_golden_runner_refuses_a_case_it_cannot_compare(opa: OPASidecar) -> None:
    # a misspelt key must fail the case, not leave part of it (or all of it) unchecked
    _, case = next(c for c in GOLDEN if c[0] == "viewer_reads_guest_config")
    d = post(opa, "pvegate/decision", case["input"])["result"]
    assert unmet(case["expect"], d) == []
    assert any("deny_code" in p for p in unmet({**case["expect"], "deny_code": ["rbac.not_granted"]}, d))
    assert case_problems(case) == []
    no_input = {k: v for k, v in case.items() if k != "input"}
    assert "the case has no input object" in case_problems(no_input)
    assert any("inputs" in p for p in case_problems({**no_input, "inputs": case["input"]}))
    assert "the case has no expect object stating allow" in case_problems({**case, "expect": {"deny_empty": True}})
    assert any("deny_code" in p for p in case_problems({**case, "expect": {"allow": True, "deny_code": []}}))


@pytest.mark.parametrize(("name", "case"), GOLDEN, ids=[n for n, _ in GOLDEN])
def test_golden_case_is_well_formed(name: str, case: dict[str, Any]) -> None:
    problems = case_problems(case)
    assert not problems, f"golden case {name}: " + "; ".join(problems)


@pytest.mark.parametrize(("name", "case"), GOLDEN, ids=[n for n, _ in GOLDEN])
def test_golden_input_matches_input_schema(name: str, case: dict[str, Any]) -> None:
    errors = list(validator("decision_input").iter_errors(case["input"]))
    if case["input"].get("contract_version") == 1:
        assert not errors, f"{name}: {errors[0].message} at {list(errors[0].path)}"
    else:
        assert errors, "an input of another contract version must not validate as version 1"


@pytest.mark.parametrize(("name", "case"), GOLDEN, ids=[n for n, _ in GOLDEN])
async def test_golden_case_live(opa: OPASidecar, name: str, case: dict[str, Any]) -> None:
    # the raw answer validates against the decision schema ...
    raw = post(opa, "pvegate/decision", case["input"])["result"]
    errors = list(validator("decision").iter_errors(raw))
    assert not errors, f"{name}: decision violates the schema: {errors[0].message} at {list(errors[0].path)}"
    problems = unmet(case["expect"], raw)
    assert not problems, f"golden case {name}: " + "; ".join(problems)

    # ... and the gateway's decision client takes it as it is (no fail-closed)
    client = DecisionClient(opa.url, timeout_ms=5000)
    try:
        decision = await client.decide(case["input"])
    finally:
        await client.close()
    assert not decision.failed_closed, decision.deny
    assert decision.allow is raw["allow"]
    assert list(decision.deny) == raw["deny"]
    assert decision.deny_codes == sorted({r["code"] for r in raw["deny_reasons"]})
    assert set(case["expect"].get("deny_codes", [])) <= set(decision.deny_codes)
    want_pending = (not raw["allow"]) and not raw["deny"] and raw["approval"]["required"]
    assert decision.approval_required is want_pending


@pytest.mark.parametrize(("name", "case"), GOLDEN, ids=[n for n, _ in GOLDEN])
def test_empty_data_denies_everything(opa_without_data: OPASidecar, name: str, case: dict[str, Any]) -> None:
    d = post(opa_without_data, "pvegate/decision", case["input"])["result"]
    assert not list(validator("decision").iter_errors(d))
    assert d["allow"] is False
    assert d["deny"], "a denial without data must say why"


def test_empty_data_lists_no_tools(opa_without_data: OPASidecar) -> None:
    listing = _listing("carol", ["pve-admins"], "human", _catalog(20))
    assert post(opa_without_data, "pvegate/visible_tools", listing)["result"] == []


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_unknown_contract_version_denied(opa: OPASidecar, version: Any) -> None:
    _, case = next(c for c in GOLDEN if c[0] == "viewer_reads_guest_config")
    assert post(opa, "pvegate/decision", case["input"])["result"]["allow"] is True
    d = post(opa, "pvegate/decision", {**case["input"], "contract_version": version})["result"]
    assert not list(validator("decision").iter_errors(d))
    assert d["allow"] is False
    assert any("unsupported contract_version" in r for r in d["deny"])


@pytest.mark.parametrize("doc", [{}, [], "call", {"contract_version": 1, "kind": "call"}])
def test_malformed_input_denied_within_schema(opa: OPASidecar, doc: Any) -> None:
    d = post(opa, "pvegate/decision", doc)["result"]
    assert not list(validator("decision").iter_errors(d))
    assert d["allow"] is False and d["deny"]


def test_decision_schema_rejects_contract_breaks() -> None:
    good = copy.deepcopy(ALLOWING_DECISION)
    v = validator("decision")
    assert not list(v.iter_errors(good))
    for bad in (
        {**good, "extra": 1},
        {**good, "allow": "yes"},
        {**good, "deny": ["x"]},  # allow with a deny reason
        {**good, "risk": {"score": 101, "level": "low", "factors": []}},
        {**good, "approval": {**good["approval"], "required": True}},  # required needs ttl/min/reason
        {**good, "quota": {"name": "q", "limit": 1, "window": "7d", "resets_in_seconds": 1}},
        {k: val for k, val in good.items() if k != "obligations"},
    ):
        assert list(v.iter_errors(bad)), bad


# --- tools/list ---------------------------------------------------------------------

PREFIXES = ("vm_", "lxc_", "guest_", "list_", "get_", "snapshot_", "backup_", "node_")
DOMAINS = ("guest", "node", "cluster", "storage", "backup", "snapshot", "container", "network", "access", "task")
EFFECTS = ("read", "write", "destroy", "exec")
SCOPES = ("guest", "node", "cluster", "storage")


def _catalog(n: int) -> list[dict[str, Any]]:
    return [
        {
            "name": f"{PREFIXES[i % len(PREFIXES)]}tool{i}",
            "title": f"tool {i}",
            "connector": "pve_api",
            "domain": DOMAINS[(i * 7) % len(DOMAINS)],
            "effect": EFFECTS[(i * 3) % len(EFFECTS)],
            "tags": ["t"],
            "scope": SCOPES[(i * 5) % len(SCOPES)],
        }
        for i in range(n)
    ]


def _listing(
    sub: str, groups: list[str], kind: str, tools: list[dict[str, Any]], roles: list[str] | None = None
) -> dict[str, Any]:
    _, case = GOLDEN[0]
    principal = {**case["input"]["principal"], "sub": sub, "groups": groups, "kind": kind, "roles": roles or []}
    return {
        "contract_version": 1,
        "kind": "list",
        "principal": principal,
        "request": {**case["input"]["request"], "method": "tools/list"},
        "tools": tools,
    }


def test_visible_tools_per_role(opa: OPASidecar) -> None:
    catalog = _catalog(40)
    viewer = set(post(opa, "pvegate/visible_tools", _listing("demo-viewer", [], "human", catalog))["result"])
    agent = set(
        post(opa, "pvegate/visible_tools", _listing("demo-agent", [], "agent", catalog, ["operator"]))["result"]
    )
    admin = set(post(opa, "pvegate/visible_tools", _listing("carol", ["pve-admins"], "human", catalog))["result"])
    by_name = {t["name"]: t for t in catalog}
    assert viewer and all(by_name[n]["effect"] == "read" for n in viewer)
    assert admin == set(by_name)
    assert viewer < admin and agent < admin
    assert not any(by_name[n]["scope"] == "node" and by_name[n]["effect"] != "read" for n in agent)
    errors = list(validator("list_input").iter_errors(_listing("demo-viewer", [], "human", catalog)))
    assert not errors, errors[0].message


def test_visible_tools_with_500_tools(opa: OPASidecar) -> None:
    """tools/list over a 500-tool catalog is one query with the right answer (its speed is
    measured by `make bench`, never asserted here)."""
    catalog = _catalog(500)
    body = post(opa, "pvegate/visible_tools", _listing("demo-agent", [], "agent", catalog, ["operator"]))
    visible = set(body["result"])
    by_name = {t["name"]: t for t in catalog}
    assert 0 < len(visible) < 500
    assert not any(by_name[n]["scope"] == "node" and by_name[n]["effect"] != "read" for n in visible)


# --- approvals ----------------------------------------------------------------------


def _approve(approver: dict[str, Any], requester: str, so_far: list[str]) -> dict[str, Any]:
    _, case = next(c for c in GOLDEN if c[0] == "agent_stops_prod_guest_needs_approval")
    inp = case["input"]
    return {
        "contract_version": 1,
        "kind": "approve",
        "approver": approver,
        "request": inp["request"],
        "pending": {
            "id": "apr_live1",
            "requester": requester,
            "tool": inp["tool"],
            "arguments_digest": inp["arguments_digest"],
            "target": inp["target"],
            "risk": {"score": 50, "level": "high", "factors": []},
            "approver_groups": ["sre-leads"],
            "min_approvals": 1,
            "approvals_so_far": [{"approver": a} for a in so_far],
        },
    }


def test_approver_four_eyes(opa: OPASidecar) -> None:
    alice = {
        "sub": "alice",
        "iss": "pvegate",
        "client_id": None,
        "roles": [],
        "groups": ["sre-leads"],
        "scopes": [],
        "kind": "human",
    }
    ok = _approve(alice, "demo-agent", [])
    assert not list(validator("approve_input").iter_errors(ok))
    assert post(opa, "pvegate/approver/decision", ok)["result"] == {
        "allow": True,
        "deny": [],
        "deny_reasons": [],
        "groups": ["sre-leads"],
    }
    own = post(opa, "pvegate/approver/decision", _approve(alice, "alice", []))["result"]
    assert not list(validator("approver_decision").iter_errors(own))
    assert own["allow"] is False and any("four-eyes" in r for r in own["deny"])
    assert "approver.self_approval" in {r["code"] for r in own["deny_reasons"]}
    bob = {**alice, "sub": "bob", "groups": []}
    not_member = post(opa, "pvegate/approver/decision", _approve(bob, "demo-agent", []))["result"]
    assert not_member["allow"] is False
    assert "approver.not_in_group" in {r["code"] for r in not_member["deny_reasons"]}
