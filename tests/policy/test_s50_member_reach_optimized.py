"""The guests a call reaches through target.members and tool.fans_out: plain and optimised agree.

Today's policy features (pool_members_add / ha_rule_create deciding on target.members, a
destination whose node the HA manager picks, check_ip_availability's leaves fanned out beyond
its target, restricting target_tags selectors held on reached guests while waivers and
reveal_secrets keep the target's own tags) were exercised by no golden case, and their answers
under the partially evaluated policy the managed sidecar loads (`opa build -O=1`) were never
compared with the plain one. A difference there is a call decided one way in tests and another
in production. The cases need policy data the shipped data does not have (scoped denies, rules
on tags), which golden cases cannot carry: each runs here on a copy of policies/ with the data
added, on the real OPA, plain and optimised, and the plain answers are checked to be the
intended ones (so the comparison is not between two identical wrong answers). The inputs are
the golden cases' own, built by the gateway's TargetResolver against the simulator.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.policy.test_optimized import _compare, _opa

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"

# guest 103 (pool lab, tagged dev, on pve2) as the resolver lists it
LAB_GUEST = {"vmid": 103, "node": "pve2", "pool": "lab", "pool_known": True, "tags": ["dev"], "exists": True}


def _golden(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((POLICIES / "golden" / f"{name}.json").read_text())[name]["input"]
    return doc


def _as(doc: dict[str, Any], *groups: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["principal"]["groups"] = [*out["principal"]["groups"], *groups]
    return out


def _extra_data(tree: Path) -> None:
    data_file = tree / "data" / "data.yaml"
    data = yaml.safe_load(data_file.read_text())
    data["roles"]["no-moves"] = {"description": "fences", "deny": [{"tools": ["pool_members_add", "ha_rule_create"]}]}
    data["roles"]["no-config-reads"] = {"description": "fences", "deny": [{"tools": ["get_guest_stored_config"]}]}
    data["bindings"] += [
        {"name": "prod-fence", "role": "no-moves", "groups": ["fenced"], "scope": {"pools": ["prod"]}},
        {"name": "pve3-fence", "role": "no-moves", "groups": ["fenced-pve3"], "scope": {"nodes": ["pve3"]}},
        {"name": "c", "role": "no-config-reads", "groups": ["no-prod-configs"], "scope": {"pools": ["prod"]}},
    ]
    guard = {"principal_groups": ["web-guard"], "reason": "web guests stay where they are"}
    data["guardrails"]["deny_rules"].append({"name": "no-web-moves", "tools": ["pool_members_add"], **guard})
    data["guardrails"]["deny_rules"][-1]["target_tags"] = ["web"]
    data["approval"]["rules"].append(
        {"name": "ha-on-web", "tools": ["ha_rule_create"], "target_tags": ["web"], "principal_groups": ["web-approve"],
         "reason": "HA rules on web guests need an approval", "approver_groups": ["sre-leads"]}
    )  # fmt: skip
    data["approval"]["waivers"].append(
        {"name": "dev-waiver", "active": True, "target_tags": ["dev"], "principal_groups": ["waived"], "reason": "w"}
    )
    data["obligations"]["reveal_secrets"].append(
        {"name": "dev-moves", "tools": ["pool_members_add", "ha_rule_create"], "target_tags": ["dev"]}
    )
    data_file.write_text(yaml.safe_dump(data))


def _questions() -> dict[str, dict[str, Any]]:
    move = _golden("admin_moves_prod_guest_into_another_pool_needs_approval")
    move_lab = copy.deepcopy(move)
    move_lab["target"]["members"]["guests"] = [LAB_GUEST]
    unknown = _golden("admin_moves_guests_not_all_known_refused")
    ha = _golden("admin_creates_ha_rule_on_prod_guest_needs_approval")
    ip = _golden("operator_agent_checks_ip_availability")
    hidden = _as(move, "fenced")
    hidden["target"]["members"]["guests"][0].update(pool=None, pool_known=False)
    calls = {
        "move": move,
        "move/fenced": _as(move, "fenced"),
        "move_lab/fenced": _as(move_lab, "fenced"),
        "move_hidden_pool/fenced": hidden,
        "unknown/fenced": _as(unknown, "fenced"),
        "unknown/fenced-pve3": _as(unknown, "fenced-pve3"),
        "ha/fenced-pve3": _as(ha, "fenced-pve3"),
        "ip": ip,
        "ip/no-prod-configs": _as(ip, "no-prod-configs"),
        "move/web-guard": _as(move, "web-guard"),
        "move_lab/web-guard": _as(move_lab, "web-guard"),
        "ha/web-approve": _as(ha, "web-approve"),
        "ha/waived": _as(ha, "waived"),
        "move_lab/waived": _as(move_lab, "waived"),
        "move_lab/reveal": move_lab,
    }
    for name, doc in list(calls.items()):  # a dry run takes other branches (no approval rules)
        dry = copy.deepcopy(doc)
        dry["dry_run"] = True
        calls[f"{name}#dry"] = dry
    return calls


def _codes(d: dict[str, Any]) -> set[str]:
    return {r["code"] for r in d["deny_reasons"]}


def test_member_reach_and_fan_out_decide_alike_plain_and_optimised(tmp_path: Path) -> None:
    opa = _opa()
    tree = tmp_path / "policies"
    shutil.copytree(POLICIES, tree)
    _extra_data(tree)
    questions = {"decisions": _questions(), "listings": {}, "approvers": {}}
    plain = _compare(opa, tree, tmp_path, questions)["decisions"]  # asserts the optimised answers equal

    # a pool-scoped deny holds on a member of the pool, not on one elsewhere; on a member whose pool
    # is hidden, and on members not known, it holds too (fail closed); a node-scoped one holds on an
    # HA rule (the HA manager picks the node) and on members not known
    assert _codes(plain["move"]) == set() and plain["move"]["approval"]["required"] is True
    for k in ("move/fenced", "move_hidden_pool/fenced", "unknown/fenced", "unknown/fenced-pve3", "ha/fenced-pve3"):
        assert "rbac.role_denies" in _codes(plain[k]), (k, plain[k]["deny"])
    assert _codes(plain["move_lab/fenced"]) == set()
    # a fanned-out leaf: a pool-scoped deny on it denies the composite (its leaf reads every guest)
    assert plain["ip"]["allow"] is True
    assert _codes(plain["ip/no-prod-configs"]) == {"rbac.composite_leaf_not_granted"}
    # a restricting selector's target_tags hold on a reached guest ...
    assert "guardrail.deny_rule" in _codes(plain["move/web-guard"])
    assert _codes(plain["move_lab/web-guard"]) == set()
    assert "approval.rule" in {r["code"] for r in plain["ha/web-approve"]["approval"]["reasons"]}
    assert plain["ha/web-approve"]["approval"]["approver_groups"] == ["sre-leads"]
    # ... a permitting one's never: a dev member does not waive an approval nor reveal a secret
    for k in ("ha/waived", "move_lab/waived"):
        assert plain[k]["approval"]["required"] is True, k
    assert plain["move_lab/reveal"]["obligations"]["reveal_secrets"] is False
    # dry runs: no approval, the denials stay
    assert plain["move#dry"]["allow"] is True and plain["ha/waived#dry"]["allow"] is True
    assert "rbac.role_denies" in _codes(plain["ha/fenced-pve3#dry"])
