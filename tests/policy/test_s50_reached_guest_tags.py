"""Risk counts the tags of the guests a call reaches, not only of its target.

A replication job's delete (which removes the guest's replicated disks), a pool move, a backup
job, a prune and a volume's delete name the guests they act on in target.members,
target.prune_removes or target.volume_of; their target itself is the cluster, a storage or a node,
which carries no tags. The risk score read only the target's tags, so deleting the replicas of a
guest tagged `critical` (or pruning its backups, or deleting one) scored as if the guest were a lab
machine: high, one approver, where the same change on the guest itself is critical and waits for
two. Checked here with the real OPA, on the plain policy and on the optimised build the managed
sidecar loads.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gateway.policy import optimized
from gateway.policy.opa_sidecar import find_opa

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
CASE = "admin_deletes_critical_guests_replication_needs_two_approvers"

QUERY = """x := {k: {"level": d.risk.level, "factors": {f.name | some f in d.risk.factors},
  "min_approvals": d.approval.min_approvals, "deny": d.deny}
  | some k, doc in input; d := data.pvegate.decision with input as doc}"""

CRITICAL_GUEST = {"vmid": 100, "node": "pve1", "pool": "db", "pool_known": True, "tags": ["critical"], "exists": True}


def _inputs() -> dict[str, dict[str, Any]]:
    base: dict[str, Any] = json.loads((POLICIES / "golden" / f"{CASE}.json").read_text())[CASE]["input"]
    prune = copy.deepcopy(base)
    prune["tool"] = {**base["tool"], "name": "backup_prune", "domain": "backup", "effect": "destroy"}
    prune["tool"].update(scope="storage", tags=["backup", "prune"])
    prune["arguments"] = {"node": "pve1", "storage": "local", "keep": "keep-last=1"}
    prune["target"] = {k: v for k, v in base["target"].items() if k != "members"}
    prune["target"]["prune_removes"] = {"known": True, "guests": [CRITICAL_GUEST]}
    delete = copy.deepcopy(prune)
    delete["tool"].update(name="storage_volume_delete", domain="storage", tags=["content"])
    volume = "local:backup/vzdump-qemu-100-2026_11_20-02_00_00.vma.zst"
    delete["arguments"] = {"node": "pve1", "storage": "local", "volume": volume}
    del delete["target"]["prune_removes"]
    delete["target"]["volume_of"] = {**CRITICAL_GUEST, "cluster": "default", "volume": volume, "content": "backup"}
    for doc in (prune, delete):  # in a window: only the risk and the approval decide
        doc["request"].update(time="2026-11-28T10:00:00Z", time_ns=1795860000000000000, weekday="Sat")
    return {"replication_job_delete": base, "backup_prune": prune, "storage_volume_delete": delete}


def _eval(opa: Path, policies: Path, tmp: Path, input_doc: Any) -> dict[str, Any]:
    f = tmp / "input.json"
    f.write_text(json.dumps(input_doc))
    args = [a for p in optimized.IGNORED for a in ("--ignore", p)]
    cmd = [str(opa), "eval", "--format", "json", *args, "--data", str(policies), "--input", str(f), QUERY]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)["result"][0]["bindings"]["x"]
    return out


@pytest.mark.parametrize("optimised", [False, True], ids=["plain", "optimised"])
def test_a_critical_guest_the_call_reaches_makes_it_critical(tmp_path: Path, optimised: bool) -> None:
    opa = find_opa()
    policies = optimized.build(opa, (POLICIES,), tmp_path / "optimized") if optimised else POLICIES
    got = _eval(opa, policies, tmp_path, _inputs())
    for tool, d in got.items():
        assert "target_tag:critical" in d["factors"], (tool, d)
        assert d["level"] == "critical", (tool, d)
        assert d["min_approvals"] == 2, (tool, d)
        assert d["deny"] == [], (tool, d)
