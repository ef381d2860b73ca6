"""The optimised policy (`opa build -O=1`, what the managed sidecar loads) answers as the plain one.

Built by the sidecar's own code (gateway/policy/optimized.py) from policies/, then both are
asked the same questions with the real OPA: every golden case's decision, the data check,
tools/list over the real catalog for the fixture principals, approver votes, and the admin
console's sections and tool catalog (non-entrypoint rules, served by the modules the build keeps). Then the
same with broken data: the data check's refusal must survive the optimisation too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy import bundles, optimized
from gateway.policy.opa_sidecar import find_opa
from gateway.tools.catalog import Catalog

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"

PRINCIPALS = ["agent", "viewer", "alice", "bob", "breakglass", "admin", "web_dev", "planner", "auditor", "nobody"]
PRINCIPALS += ["contractor"]

# every question in one query per policy: decisions, listings, approver votes, the data check
QUERY = """x := {
  "decisions": {k: d | some k, doc in input.decisions; d := data.pvegate.decision with input as doc},
  "listings": {k: sort(v) | some k, doc in input.listings; v := data.pvegate.visible_tools with input as doc},
  "approvers": {k: d | some k, doc in input.approvers; d := data.pvegate.approver.decision with input as doc},
  "console": {k: [sort(v), r] | some k, doc in input.listings
    v := data.pvegate.console.sections with input as doc
    r := data.pvegate.console.tool_roles with input as doc},
  "data_check": data.pvegate.data_check,
}"""


def _opa() -> Path:
    try:
        return find_opa()
    except Exception:
        pytest.skip("no OPA binary (make tools)")


def _eval(opa: Path, args: list[str], query: str, input_doc: Any = None, tmp: Path | None = None) -> Any:
    cmd = [str(opa), "eval", "--format", "json", *args]
    if input_doc is not None:
        assert tmp is not None
        f = tmp / "input.json"
        f.write_text(json.dumps(input_doc))
        cmd += ["--input", str(f)]
    done = subprocess.run([*cmd, query], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)["result"][0]
    return out["bindings"]["x"] if "bindings" in out else out["expressions"][0]["value"]


def _plain(policies: Path) -> list[str]:
    args = []
    for pattern in optimized.IGNORED:
        args += ["--ignore", pattern]
    return [*args, "--data", str(policies)]


def _malformed(doc: dict[str, Any]) -> dict[str, Any]:
    """Variants of a golden input that the input checks refuse (or that lack a part they do not check):
    the optimiser writes support rules for those checks, where OPA 1.22 once mixed two up."""
    out: dict[str, Any] = {}
    for name, path, value in [
        ("no_principal", ("principal",), None),
        ("empty_sub", ("principal", "sub"), ""),
        ("no_sub", ("principal", "sub"), None),
        ("bad_kind", ("principal", "kind"), "robot"),
        ("no_roles", ("principal", "roles"), None),
        ("bad_time", ("request",), {"time": "not a time"}),
        ("no_request", ("request",), None),
        ("list_kind", ("kind",), "list"),
        ("no_kind", ("kind",), None),
        ("version_2", ("contract_version",), 2),
        ("no_tool_name", ("tool", "name"), None),
        ("bad_effect", ("tool", "effect"), "delete"),
        ("no_domain", ("tool", "domain"), None),
        ("no_target", ("target",), None),
        ("no_usage", ("usage",), None),
        ("no_digest", ("arguments_digest",), None),
    ]:
        variant = json.loads(json.dumps(doc))
        parent = variant
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue  # (a listing has no tool)
        if value is None:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
        out[name] = variant
    return out


def _questions(opa: Path, tmp: Path) -> dict[str, Any]:
    decisions: dict[str, Any] = {}
    for f in sorted((POLICIES / "golden").glob("*.json")):
        for name, case in json.loads(f.read_text()).items():
            decisions[name] = case["input"]
            decisions.update({f"{name}#{k}": v for k, v in _malformed(case["input"]).items()})
    decisions.update({"#empty": {}, "#string": "call"})
    catalog = Catalog.load(REPO / "connectors").policy_views
    fx = "data.pvegate.fixtures_test"
    groups = ["sre-leads"]
    q = f"""x := {{
      "listings": {{p: {fx}.listing_input({fx}[p], input.catalog) | some p in input.principals}},
      "approvers": {{
        concat("/", [a, r, concat(",", g)]): {fx}.approve_input({fx}[a], r, g, [])
        | some a in input.principals; some r in ["demo-agent", "alice"]; some g in [[], {json.dumps(groups)}]
      }},
    }}"""
    generated = _eval(opa, ["--data", str(POLICIES)], q, {"catalog": catalog, "principals": PRINCIPALS}, tmp)
    assert len(generated["listings"]) == len(PRINCIPALS) and len(decisions) >= 30
    # malformed listings too (the listing shares the input checks)
    some = next(iter(generated["listings"].values()))
    for k, v in _malformed(some).items():
        generated["listings"][f"#{k}"] = v
    return {"decisions": decisions, **generated}


def _compare(opa: Path, policies: Path, tmp: Path, questions: dict[str, Any]) -> dict[str, Any]:
    built = optimized.build(opa, (policies,), tmp / "optimized")
    plain = _eval(opa, _plain(policies), QUERY, questions, tmp)
    fast = _eval(opa, _plain(built), QUERY, questions, tmp)
    _same(plain, fast)
    return plain


def _same(plain: dict[str, Any], fast: dict[str, Any]) -> None:
    for part in ("decisions", "listings", "approvers", "console"):
        assert plain[part].keys() == fast[part].keys()
        differ = [k for k in plain[part] if plain[part][k] != fast[part][k]]
        assert not differ, f"{part}: the optimised policy answers differently for {differ}"
    assert plain["data_check"] == fast["data_check"]


def test_optimized_policy_answers_as_the_plain_one(tmp_path: Path) -> None:
    opa = _opa()
    questions = _questions(opa, tmp_path)
    plain = _compare(opa, POLICIES, tmp_path, questions)
    # the comparison covers real variety: allowed, denied and pending calls; visible tools
    allowed = {k for k, d in plain["decisions"].items() if d["allow"]}
    assert 0 < len(allowed) < len(plain["decisions"])
    assert any(d["approval"]["required"] for d in plain["decisions"].values())
    assert any(plain["listings"].values()) and not all(plain["listings"].values())
    assert any(d["allow"] for d in plain["approvers"].values())
    assert any(roles for _, roles in plain["console"].values())
    assert plain["data_check"]["valid"] is True


def test_optimized_bundle_answers_as_the_plain_one(tmp_path: Path) -> None:
    """`pvegate bundle build` builds partially evaluated by default (gateway/policy/bundles.py):
    the same questions, asked of that bundle and of the plain one, get the same answers."""
    opa = _opa()
    questions = _questions(opa, tmp_path)
    plain_bundle, fast_bundle = tmp_path / "plain.tar.gz", tmp_path / "fast.tar.gz"
    bundles.build(POLICIES, plain_bundle, None, unsigned=True, checks=False, optimize=False)
    bundles.build(POLICIES, fast_bundle, None, unsigned=True, checks=False)
    meta = bundles.manifest_of(fast_bundle)["metadata"]
    assert isinstance(meta, dict) and meta["optimized"] is True
    plain = _eval(opa, ["--bundle", str(plain_bundle)], QUERY, questions, tmp_path)
    fast = _eval(opa, ["--bundle", str(fast_bundle)], QUERY, questions, tmp_path)
    _same(plain, fast)
    assert any(d["allow"] for d in plain["decisions"].values()) and plain["data_check"]["valid"] is True


def test_optimized_policy_keeps_the_data_refusal(tmp_path: Path) -> None:
    opa = _opa()
    tree = tmp_path / "policies"
    shutil.copytree(POLICIES, tree)
    data_file = tree / "data" / "data.yaml"
    data = yaml.safe_load(data_file.read_text())
    data["guardrails"]["protected_tag"] = ["crown-jewel"]  # a misspelled key
    data_file.write_text(yaml.safe_dump(data))
    questions = _questions(opa, tmp_path)
    plain = _compare(opa, tree, tmp_path, questions)
    check = plain["data_check"]
    assert check["valid"] is False
    assert check["refusal"]["allow"] is False
    assert any("guardrails.protected_tag: unknown key" in p for p in check["problems"])


def test_build_failure_is_reported(tmp_path: Path) -> None:
    opa = _opa()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "p.rego").write_text("package pvegate\n\ndecision := {\n")
    with pytest.raises(optimized.OptimizeError, match="opa build -O=1 failed"):
        optimized.build(opa, (broken,), tmp_path / "out")


def test_builds_are_cached_by_content_in_a_private_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opa = _opa()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(optimized, "_cache", {})
    tree = tmp_path / "policies"
    shutil.copytree(POLICIES, tree, ignore=shutil.ignore_patterns("golden", "*_test.rego"))
    first = optimized.build_cached(opa, (tree,))
    assert first.parent == tmp_path / "cache" / "pvegate" / "opa-optimized" and (first / ".done").exists()
    monkeypatch.setattr(optimized, "_cache", {})  # another process: found on disk, not rebuilt
    mtime = (first / "data.json").stat().st_mtime_ns
    assert optimized.build_cached(opa, (tree,)) == first and (first / "data.json").stat().st_mtime_ns == mtime
    # changed data: another build, with the new data in it
    data = tree / "data" / "data.yaml"
    data.write_text(data.read_text().replace("limit: 120", "limit: 121", 1))
    second = optimized.build_cached(opa, (tree,))
    assert second != first and '"limit":121' in (second / "data.json").read_text().replace(" ", "")
    # a cache directory others may write to is not used
    monkeypatch.setattr(optimized, "_cache", {})
    (tmp_path / "cache" / "pvegate" / "opa-optimized").chmod(0o777)
    elsewhere = optimized.build_cached(opa, (tree,))
    assert tmp_path / "cache" not in elsewhere.parents


def test_an_opa_replaced_in_place_builds_anew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache key is the binary's path and what is there: an OPA upgraded in place must not be handed
    the old binary's partial evaluation."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(optimized, "_cache", {})
    opa = tmp_path / "bin" / "opa"
    opa.parent.mkdir()
    shutil.copy2(_opa(), opa)
    tree = tmp_path / "policies"
    shutil.copytree(POLICIES, tree, ignore=shutil.ignore_patterns("golden", "*_test.rego"))
    first = optimized.build_cached(opa, (tree,))
    assert optimized.build_cached(opa, (tree,)) == first
    replacement = tmp_path / "opa.new"  # an upgrade: another file renamed over the path
    shutil.copy(_opa(), replacement)
    os.utime(replacement, ns=(1_000_000_000, 1_000_000_000))
    os.replace(replacement, opa)
    assert optimized.build_cached(opa, (tree,)) != first


def _call(template: dict[str, Any], sub: str, roles: list[str], groups: list[str], kind: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(template))
    doc["principal"].update(sub=sub, roles=roles, groups=groups, kind=kind)
    return doc


def test_optimized_policy_denies_composite_leaves_and_scoped_denies_as_the_plain_one(tmp_path: Path) -> None:
    """A composite tool is denied where a role or a deny rule forbids one of its leaves, and a scoped
    deny holds on either end of a migration: the optimised policy must agree, and the answers must
    be the intended ones (so the comparison is not between two identical wrong answers)."""
    opa = _opa()
    tree = tmp_path / "policies"
    shutil.copytree(POLICIES, tree)
    data_file = tree / "data" / "data.yaml"
    data = yaml.safe_load(data_file.read_text())
    data["roles"]["restricted"] = {"description": "contractors", "deny": [{"tools": ["lxc_docker_inspect"]}]}
    data["roles"]["fence"] = {"description": "no migration on pve2", "deny": [{"tools": ["guest_migrate"]}]}
    data["bindings"] += [
        {"name": "contractors-restricted", "role": "restricted", "groups": ["contractors"]},
        {"name": "pve2-fence", "role": "fence", "groups": ["pve-admins"], "scope": {"nodes": ["pve2"]}},
    ]
    rule = {"name": "no-arp", "tools": ["node_arp_table"], "principal_groups": ["contractors"], "reason": "no"}
    data["guardrails"]["deny_rules"].append(rule)
    data_file.write_text(yaml.safe_dump(data))

    views = {t["name"]: t for t in Catalog.load(REPO / "connectors").policy_views}
    golden = json.loads((POLICIES / "golden" / "admin_relocates_ha_guest_needs_approval.json").read_text())
    template = golden["admin_relocates_ha_guest_needs_approval"]["input"]
    template["target"]["ha_state"] = None
    template["target"]["tags"] = []
    decisions: dict[str, Any] = {}
    for who, groups in (("operator", []), ("contractor", ["contractors"])):
        for tool in ("inspect_compose_stack", "check_ip_availability"):
            doc = _call(template, who, ["operator"], groups, "agent")
            doc["tool"] = views[tool]
            decisions[f"{who}/{tool}"] = doc
    for to in ("pve2", "pve3"):
        doc = _call(template, "ada", [], ["pve-admins"], "human")
        doc["tool"] = views["guest_migrate"]
        where = {k: doc["target"][k] for k in ("cluster", "vmid", "pool", "tags")}
        doc["target"]["destination"] = {**where, "node": to}
        decisions[f"migrate/{to}"] = doc
    questions = {"decisions": decisions, "listings": {}, "approvers": {}}
    plain = _compare(opa, tree, tmp_path, questions)
    assert plain["data_check"]["valid"] is True, plain["data_check"]
    allowed = {k for k, d in plain["decisions"].items() if d["allow"]}
    assert allowed == {"operator/inspect_compose_stack", "operator/check_ip_availability", "migrate/pve3"}
    codes = {k: {r["code"] for r in d["deny_reasons"]} for k, d in plain["decisions"].items()}
    assert codes["contractor/inspect_compose_stack"] == {"rbac.composite_leaf_not_granted"}
    assert codes["contractor/check_ip_availability"] == {"rbac.composite_leaf_not_granted"}
    assert codes["migrate/pve2"] == {"rbac.role_denies"}
