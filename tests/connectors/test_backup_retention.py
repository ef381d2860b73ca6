"""Retention that deletes backups is destroy-class, wherever it is set (review findings 2, 4-6).

A backup job's `prune-backups` is a prune that runs unattended after every run of the job
(pve-manager's VZDump prunes each guest's backups on the job's storage by it; `remove` defaults
to 1), and an ad-hoc vzdump applies the storage's retention the same way. So the job write
tools set no retention but keep-all, a retention is set by `backup_job_retention_set`
(destroy, like `backup_prune`), and `backup_now` sends `remove: 0`. The same file checks the
tool tags the example policy reads for the other findings (cloud-init credentials, the
irreversible template conversion) and, end to end, what an operator agent gets for each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.tools.catalog import Catalog
from gateway.tools.tool import ArgumentError
from tests.connectors.test_provision_e2e import admin, call, run, sent, text
from tests.support import GatewayThread, per_module

CONNECTORS = Path(__file__).resolve().parents[2] / "connectors"
JOB_WRITES = ("backup_job_create", "backup_job_update")
JOB_ARGS = {"backup_job_create": {"id": "tidy", "schedule": "*/15", "storage": "pbs", "all": True}}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(CONNECTORS)


def _job_args(name: str) -> dict[str, Any]:
    return dict(JOB_ARGS.get(name, {"id": "backup-prod-nightly"}))


@pytest.mark.parametrize("name", JOB_WRITES)
def test_backup_job_write_tools_set_no_retention(catalog: Catalog, name: str) -> None:
    tool = catalog.get(name)
    assert tool is not None and tool.effect == "write"
    assert "keep" not in tool.parameters["properties"]
    with pytest.raises(ArgumentError, match="keep"):
        tool.validate({**_job_args(name), "keep": "keep-last=1"})
    # keep-all (the job deletes nothing) is the one retention a write may set
    with pytest.raises(ArgumentError, match="keep_all"):
        tool.validate({**_job_args(name), "keep_all": False})
    assert tool.validate({**_job_args(name), "keep_all": True})["keep_all"] is True
    if name == "backup_job_create":  # a new job keeps every backup, keep_all given or not (test_s51_backup_job_prunes)
        assert tool.spec["fixed"]["prune-backups"] == "keep-all=1" and "prune-backups" not in tool.spec["body"]
    else:
        assert tool.spec["body"]["prune-backups"] == ["keep-all={keep_all}"]


def test_backup_job_retention_is_destroy_class(catalog: Catalog) -> None:
    tool = catalog.get("backup_job_retention_set")
    assert tool is not None
    assert (tool.effect, tool.domain, tool.scope) == ("destroy", "backup", "cluster")
    assert {"backup", "job", "prune"} <= set(tool.tags)
    assert (tool.spec["method"], tool.spec["path"]) == ("PUT", "/cluster/backup/{id}")
    assert tool.spec["body"] == {"prune-backups": "keep"}


def test_only_destroy_tools_send_a_retention_that_deletes(catalog: Catalog) -> None:
    """Any mutation that sends `prune-backups` from a caller's retention is destroy-class (a read
    only previews it); keep-all deletes nothing."""
    for tool in catalog:
        if tool.connector != "pve_api" or tool.effect == "read":
            continue
        for part in ("body", "query"):
            value = (tool.spec.get(part) or {}).get("prune-backups")
            if value is not None and value != ["keep-all={keep_all}"]:
                assert tool.effect == "destroy", f"{tool.name} sets a retention as {tool.effect}"


def test_backup_now_prunes_nothing(catalog: Catalog) -> None:
    """vzdump prunes the guest's older backups by the storage's retention unless told not to."""
    for tool in catalog:
        if tool.connector == "pve_api" and tool.spec["path"].endswith("/vzdump") and tool.spec["method"] == "POST":
            assert tool.effect == "destroy" or tool.spec["fixed"].get("remove") == 0, tool.name
    backup_now = catalog.get("backup_now")
    assert backup_now is not None and backup_now.spec["fixed"] == {"compress": "zstd", "remove": 0}


def test_policy_relevant_tags(catalog: Catalog) -> None:
    cloudinit = catalog.get("vm_cloudinit_set")
    template = catalog.get("guest_convert_to_template")
    assert cloudinit is not None and "credentials" in cloudinit.tags
    assert template is not None and "irreversible" in template.tags


# --- end to end: SDK client -> gateway -> real OPA (example policy) -> simulator ---------


def _agent(env: DevEnv) -> str:
    return env.token(per_module("retention-agent"), ["operator"], kind="agent")


def _outcome(res: Any) -> str:
    return str((res.meta or {}).get("pvegate/outcome"))


async def test_operator_agent_sets_no_job_retention(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.clear_logs()
    old = await call(env, _agent(env), "backup_job_update", {"id": "backup-prod-nightly", "keep": "keep-last=1"})
    assert old.is_error and _outcome(old) == "invalid" and "keep" in text(old), text(old)
    res = await call(env, _agent(env), "backup_job_retention_set", {"id": "backup-prod-nightly", "keep": "keep-last=1"})
    assert res.is_error and _outcome(res) == "denied", text(res)
    assert "rbac.not_granted" in res.structured_content["codes"], text(res)
    assert sent(sim) == []


async def test_job_keep_all_and_retention_are_sent_as_declared(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    job = {"id": "retention_probe", "schedule": "sun 04:00", "storage": "pbs", "vmids": "103", "keep_all": True}
    await run(
        gateway, env, sim, "backup_job_create", job,
        ("POST", "/api2/json/cluster/backup", {"id": "retention_probe", "schedule": "sun 04:00", "storage": "pbs",
                                               "vmid": "103", "prune-backups": "keep-all=1", "compress": "zstd"}),
    )  # fmt: skip
    verdict = await run(
        gateway, env, sim, "backup_job_retention_set", {"id": "retention_probe", "keep": "keep-last=3"},
        ("PUT", "/api2/json/cluster/backup/retention_probe", {"prune-backups": "keep-last=3"}),
    )  # fmt: skip
    assert verdict in ("held", "denied")  # destroy-class: a maintenance window and an SRE lead
    await run(
        gateway, env, sim, "backup_job_update", {"id": "retention_probe", "keep_all": True},
        ("PUT", "/api2/json/cluster/backup/retention_probe", {"prune-backups": "keep-all=1"}),
    )  # fmt: skip
    await run(
        gateway, env, sim, "backup_job_delete", {"id": "retention_probe"},
        ("DELETE", "/api2/json/cluster/backup/retention_probe", None),
    )  # fmt: skip


async def test_backup_now_sends_remove_0(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    await run(
        gateway, env, sim, "backup_now", {"vmid": 103, "storage": "local"},
        ("POST", "/api2/json/nodes/pve2/vzdump", {"vmid": "103", "storage": "local", "compress": "zstd",
                                                  "remove": "0"}),
    )  # fmt: skip


async def test_operator_agent_cloudinit_credentials_wait_for_a_human(
    env: DevEnv, gateway: GatewayThread, sim: Any
) -> None:
    sim.clear_logs()
    res = await call(env, _agent(env), "vm_cloudinit_set", {"vmid": 103, "ciuser": "ops"})
    assert res.is_error and _outcome(res) == "pending_approval", text(res)
    assert "an agent setting credentials in a guest" in text(res), text(res)
    assert sent(sim) == []


async def test_operator_agent_nic_firewall_off_is_critical(env: DevEnv, gateway: GatewayThread, sim: Any) -> None:
    sim.clear_logs()
    args = {"vmid": 103, "index": 3, "model": "virtio", "bridge": "vmbr0", "firewall": False}
    res = await call(env, _agent(env), "vm_nic_set", args)
    assert res.is_error and _outcome(res) == "pending_approval", text(res)
    assert "critical" in text(res), text(res)
    assert sent(sim) == []


async def test_protected_guest_is_not_turned_into_a_template(env: DevEnv, gateway: GatewayThread, sim: Any) -> None:
    sim.clear_logs()
    res = await call(env, admin(env), "guest_convert_to_template", {"vmid": 101})  # db01: tagged protected
    assert res.is_error and _outcome(res) == "denied", text(res)
    assert "guardrail.protected_tag" in res.structured_content["codes"], text(res)
    assert sent(sim) == []
