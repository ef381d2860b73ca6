"""A restore over a container takes the backup's privilege unless the call sets it: another
container's privileged backup restored over an unprivileged one would make it privileged (root in
it is root on the node). The gateway reads both configs (target.privileged, backup_of.privileged)
and the guard rails refuse that escalation before anything is sent.

Its own simulator: the small scenario plus a privileged container 210 with one PBS backup."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.dev.devenv import DevEnv, make_env
from tests.connectors.test_provision_e2e import admin, call, text
from tests.support import GatewayThread, audit_rows, free_port, kept_input, mutations

SCENARIOS = Path(__file__).resolve().parents[2] / "gateway" / "sim" / "scenarios"


@pytest.fixture(scope="module")
def psim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    work = tmp_path_factory.mktemp("priv-sim")
    scenario = yaml.safe_load((SCENARIOS / "small.yaml").read_text())
    scenario["guests"].append(
        {"vmid": 210, "type": "lxc", "node": "pve1", "name": "legacy-priv", "status": "stopped", "tags": ["dev"],
         "pool": "lab", "cores": 1, "memory_mb": 512, "disk_gb": 4, "config": {"unprivileged": 0}}
    )  # fmt: skip
    scenario["backups"].append({"storage": "pbs", "vmid": 210, "age_hours": 5, "size_mb": 100})
    path = work / "privileged.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    handle = start_simulator(str(path), work / "sim", ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def penv(psim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("priv-gw"), {"default": psim}, port=free_port())


@pytest.fixture(scope="module")
def pgw(penv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(penv.config).start()
    yield gw
    gw.stop()


async def test_a_privileged_backup_is_not_restored_over_an_unprivileged_container(
    pgw: GatewayThread, penv: DevEnv, psim: Any
) -> None:
    assert psim.state()["guests"]["202"]["config"].get("unprivileged") == 1
    items = await call(penv, admin(penv), "list_storage_content", {"node": "pve1", "storage": "pbs"})
    archive = next(i["volid"] for i in items.structured_content["items"] if i.get("vmid") == 210)
    psim.clear_logs()
    res = await call(
        penv, admin(penv), "lxc_restore_in_place", {"vmid": 202, "archive": archive, "storage": "local-lvm"}
    )
    assert res.is_error and "guardrail.privileged_restore" in res.structured_content["codes"], text(res)
    assert "over unprivileged container 202 it would make it privileged" in text(res), text(res)
    assert mutations(psim) == []
    rows = audit_rows(penv.config.audit_path, res.meta["pvegate/request_id"])
    target = kept_input(next(r for r in rows if r["kind"] == "decision"))["target"]
    assert (target["privileged"], target["backup_of"]["privileged"]) == (False, True), target
