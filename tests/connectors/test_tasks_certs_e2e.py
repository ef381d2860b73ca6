"""Tasks, certificates and subscription end to end (issue #19): SDK client -> HTTPS -> JWT ->
real OPA -> pve_api/composite runtime -> simulator, with the example organisation's policy.

A simulator and gateway of this module's own: stopping a task needs long tasks, which the
shared simulator must not slow down. task_stop is the one mutation: it must send exactly the
declared request, and the task it stopped shows stopped with PVE's error. No secret of the
certificate family (ACME account key, DNS plugin credentials, subscription key) reaches a
result or the audit database.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from tests.connectors.test_provision_e2e import admin, call, read, run, text
from tests.support import GatewayThread, audit_bytes, free_port

TASK_TOOLS = {"task_list_filtered", "tasks_running", "task_log_page", "task_log_tail", "task_stop"}
CERT_TOOLS = {
    "node_certificates", "node_acme_config", "acme_accounts", "acme_account_get", "acme_plugins", "acme_plugin_get",
    "acme_directories", "subscription_status",
}  # fmt: skip
PLANTED = "SimPlantedSecret"
SUBSCRIPTION_KEY = "pve2c-" + hashlib.sha256(b"simlab/pve1").hexdigest()[:10]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("sim-tasks"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def env(sim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(Path(tmp_path_factory.mktemp("gw-tasks")), {"default": sim}, port=free_port())


@pytest.fixture(scope="module")
def gateway(env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(env.config).start()
    yield gw
    gw.stop()


async def test_stop_a_running_task(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    sim.set_faults(task_seconds=30)
    try:
        start = asyncio.create_task(call(env, admin(env), "vm_start", {"vmid": 102}))
        running: list[dict[str, Any]] = []
        for _ in range(100):
            await asyncio.sleep(0.1)
            running = [t for t in (await read(env, "tasks_running", {}))["items"] if t["type"] == "qmstart"]
            if running:
                break
        assert running and running[0]["node"] == "pve2" and running[0]["id"] == "102", running
        upid = running[0]["upid"]
        active = (await read(env, "task_list_filtered", {"node": "pve2", "source": "active"}))["items"]
        assert [t["upid"] for t in active] == [upid]

        await run(
            gateway, env, sim, "task_stop", {"upid": upid}, ("DELETE", f"/api2/json/nodes/pve2/tasks/{upid}", None)
        )
        res = await asyncio.wait_for(start, 30)
        assert res.is_error and "interrupted by signal" in text(res)  # the start call sees its task end
    finally:
        sim.set_faults(task_seconds=None)
    st = await read(env, "get_task_status", {"upid": upid})
    assert (st["status"], st["exitstatus"]) == ("stopped", "interrupted by signal")
    assert (await read(env, "get_guest_status", {"vmid": 102}))["status"] == "stopped"  # the start never happened
    assert (await read(env, "tasks_running", {}))["items"] == []

    failed = await read(env, "task_list_filtered", {"node": "pve2", "typefilter": "qmstart", "statusfilter": "error"})
    assert [t["upid"] for t in failed["items"]] == [upid]
    ok = await read(env, "task_list_filtered", {"node": "pve2", "typefilter": "qmstart", "statusfilter": "ok"})
    assert upid not in [t["upid"] for t in ok["items"]]

    page = await read(env, "task_log_page", {"upid": upid, "start": 0, "limit": 1})
    assert len(page["items"]) == 1 and page["total"] >= 2
    tail = await read(env, "task_log_tail", {"upid": upid, "lines": 2})
    assert tail["total"] == page["total"] and [r["t"] for r in tail["lines"]][-1] == "TASK ERROR: interrupted by signal"
    assert [r["n"] for r in tail["lines"]] == [page["total"] - 1, page["total"]]

    # a finished task: nothing to stop, nothing changes
    done = await call(env, admin(env), "vm_start", {"vmid": 102})
    assert not done.is_error, text(done)


async def test_task_filters(gateway: GatewayThread, env: DevEnv) -> None:
    res = await call(env, admin(env), "task_list_filtered", {"node": "pve2", "statusfilter": "ok;rm"})
    assert res.is_error and "statusfilter" in text(res)
    s = await read(env, "task_list_filtered", {"node": "pve2", "userfilter": "root@pam", "limit": 500})
    assert all("root@pam" in t["user"] for t in s["items"])


CERT_READS: list[tuple[str, dict[str, Any], Any]] = [
    ("node_certificates", {"node": "pve1"},
     lambda s: [c["filename"] for c in s["items"]] == ["pve-root-ca.pem", "pve-ssl.pem"]
     and "pve1.lab.internal" in s["items"][1]["san"] and all("pem" not in c for c in s["items"])),
    ("node_acme_config", {"node": "pve1"}, lambda s: s["acmedomain0"] == "domain=pve1.lab.internal,plugin=cf_lab"),
    ("acme_accounts", {}, lambda s: s["items"] == [{"name": "default"}]),
    ("acme_account_get", {"name": "default"},
     lambda s: s["account"]["key"] == "****" and s["account"]["status"] == "valid" and s["directory"].startswith("https://")),
    ("acme_plugins", {},
     lambda s: {p["plugin"]: p.get("api") for p in s["items"]} == {"standalone": None, "cf_lab": "cf"}
     and all("data" not in p for p in s["items"])),
    ("acme_plugin_get", {"id": "cf_lab"}, lambda s: s["api"] == "cf" and "data" not in s),
    ("acme_directories", {}, lambda s: len(s["items"]) == 2),
    ("subscription_status", {"node": "pve1"},
     lambda s: s["status"] == "active" and s["key"] == "pve2c-******" + SUBSCRIPTION_KEY[-4:]),
    ("subscription_status", {"node": "pve2"}, lambda s: s["status"] == "notfound" and "key" not in s),
]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "check"), CERT_READS, ids=[f"{r[0]}-{i}" for i, r in enumerate(CERT_READS)])
async def test_certificate_reads(
    gateway: GatewayThread, env: DevEnv, name: str, args: dict[str, Any], check: Any
) -> None:
    res = await call(env, admin(env), name, args)
    assert not res.is_error, text(res)
    assert check(res.structured_content), res.structured_content
    assert PLANTED not in text(res) and SUBSCRIPTION_KEY not in text(res)


def test_certificate_secrets_never_reach_the_audit(gateway: GatewayThread, env: DevEnv) -> None:
    raw, rows = audit_bytes(env.config.audit_path)
    assert {"acme_account_get", "acme_plugins", "subscription_status"} <= {r["tool"] for r in rows}
    assert PLANTED.encode() not in raw and SUBSCRIPTION_KEY.encode() not in raw
