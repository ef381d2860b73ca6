"""tools/list hides a composite tool a leaf of which the lister may never call (a role bound without
a scope denies it): the decision denies such a composite on every target. The optimised policy must
list as the plain one, and the answers must be the intended ones (not two identical wrong ones)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from gateway.tools.catalog import Catalog
from tests.policy.test_optimized import POLICIES, REPO, _compare, _eval, _opa


def test_optimized_policy_hides_a_composite_whose_leaf_is_denied_everywhere(tmp_path: Path) -> None:
    opa = _opa()
    tree = tmp_path / "policies"
    shutil.copytree(POLICIES, tree)
    data_file = tree / "data" / "data.yaml"
    data = yaml.safe_load(data_file.read_text())
    data["roles"]["restricted"] = {"description": "contractors", "deny": [{"tools": ["lxc_docker_inspect"]}]}
    data["roles"]["webfence"] = {"description": "no arp in web", "deny": [{"tools": ["node_arp_table"]}]}
    data["bindings"] += [
        {"name": "contractors-restricted", "role": "restricted", "groups": ["contractors"]},
        {"name": "contractors-webfence", "role": "webfence", "groups": ["contractors"], "scope": {"pools": ["web"]}},
    ]
    data_file.write_text(yaml.safe_dump(data))

    catalog = Catalog.load(REPO / "connectors").policy_views
    fx = "data.pvegate.fixtures_test"
    q = f"""x := {{
      "operator": {fx}.listing_input(object.union({fx}.contractor, {{"groups": []}}), input.catalog),
      "contractor": {fx}.listing_input({fx}.contractor, input.catalog),
    }}"""
    listings: dict[str, Any] = _eval(opa, ["--data", str(POLICIES)], q, {"catalog": catalog}, tmp_path)
    plain = _compare(opa, tree, tmp_path, {"decisions": {}, "listings": listings, "approvers": {}})
    seen = {k: set(v) for k, v in plain["listings"].items()}
    # the operator sees both composites; the contractor not the one reading through the denied leaf,
    # and still the one whose leaf is denied in pool web only (callable elsewhere)
    assert {"inspect_compose_stack", "check_ip_availability"} <= seen["operator"], json.dumps(plain["listings"])
    assert "inspect_compose_stack" not in seen["contractor"] and "lxc_docker_inspect" not in seen["contractor"]
    assert "check_ip_availability" in seen["contractor"]
