"""A backup job that prunes by its node's /etc/vzdump.conf, or by its legacy `maxfiles`, was taken
for one that keeps every backup.

vzdump settles a run's retention (PVE::VZDump `new`, parse_prune_backups_maxfiles) from the job's
`prune-backups`; else its deprecated `maxfiles` (keep-last=N, still in the 9.1 schema); else the
storage's; else the node's /etc/vzdump.conf `prune-backups` (or `maxfiles`). The gateway read only
the first and the storage's, so a job on a storage without a retention counted as pruning nothing:
`backup_job_update` pointing such a job at a protected guest (db01, 101) passed the guard rail
"a protected guest's backups are never pruned", and its next run deleted that guest's backups.
Now the job's maxfiles counts, and without a storage retention every node the job runs on is asked
(GET /nodes/{node}/vzdump/defaults); a node that cannot be asked is not known to keep every backup.
Real simulator, real OPA, the gateway over HTTPS.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.dev.devenv import make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import Api
from tests.connectors.test_s51_backup_job_prunes import ALWAYS, admin, codes
from tests.support import GatewayThread, example_policy, free_port, mutations


def scenario(path: Path) -> Path:
    """The small scenario with every node online; pve1's vzdump.conf keeps the last two backups, pve2's
    sets nothing (keeps all). Storage local sets no retention. Three jobs of guest 103 on local."""
    data = yaml.safe_load((REPO_ROOT / "gateway" / "sim" / "scenarios" / "small.yaml").read_text())
    for node in data["nodes"]:
        node["online"] = True
        if node["name"] == "pve1":
            node["vzdump_conf"] = {"prune-backups": "keep-last=2"}
    base = {"type": "vzdump", "enabled": 1, "schedule": "03:00", "storage": "local", "vmid": "103", "mode": "snapshot"}
    data["backup_jobs"] += [
        {**base, "id": "lab-node-retention"},  # every node: pve1's vzdump.conf prunes
        {**base, "id": "lab-maxfiles", "node": "pve2", "maxfiles": 2},  # its own legacy retention
        {**base, "id": "lab-keeps", "node": "pve2"},  # pve2 and local keep everything
    ]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def psim(tmp_path: Path) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator(str(scenario(tmp_path / "scenario.yaml")), tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()


@pytest.fixture
def api(psim: Any, tmp_path: Path) -> Iterator[Api]:
    def edit(data: dict[str, Any]) -> None:
        data["guardrails"]["maintenance_windows"] = ALWAYS

    opa = example_policy(tmp_path / "policy", edit)
    env = make_env(tmp_path / "gw", {"default": psim}, port=free_port(), opa=opa)
    gw = GatewayThread(env.config).start()
    try:
        yield Api(env)
    finally:
        gw.stop()


async def test_a_job_pruning_by_its_nodes_vzdump_conf_may_not_take_a_protected_guest(api: Api, psim: Any) -> None:
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-node-retention", "vmids": "103,101"})
    assert "guardrail.protected_tag" in codes(res), res
    assert mutations(psim) == []


async def test_a_job_pruning_by_its_legacy_maxfiles_may_not_take_a_protected_guest(api: Api, psim: Any) -> None:
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-maxfiles", "vmids": "103,101"})
    assert "guardrail.protected_tag" in codes(res), res
    assert mutations(psim) == []


async def test_a_job_whose_nodes_keep_every_backup_still_may(api: Api, psim: Any) -> None:
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-keeps", "vmids": "103,101"})
    assert "guardrail.protected_tag" not in codes(res) and "guardrail.prune_unknown" not in codes(res), res


async def test_a_node_that_cannot_be_asked_is_not_one_that_keeps_every_backup(api: Api, psim: Any) -> None:
    psim.set_faults(error_rate=1.0, error_path="^/nodes/pve2/vzdump/defaults")
    res = await api.call(admin(api), "backup_job_update", {"id": "lab-keeps", "vmids": "103,102"})
    assert "guardrail.prune_unknown" in codes(res), res
    psim.set_faults()
    assert mutations(psim) == []
