"""Runtime faults through the admin endpoint."""

from __future__ import annotations

import time

import httpx
import pytest

from gateway.sim.harness import SimHandle

from .conftest import api


def test_error_latency_drop_offline(simw: SimHandle) -> None:
    a = api(simw)
    try:
        simw.set_faults(error_rate=1.0, error_status=596, error_path=r"^/nodes$")
        r = a.get("/nodes")
        assert r.status_code == 596 and r.json()["data"] is None
        assert a.get("/version").status_code == 200  # other paths unaffected
        simw.set_faults(error_rate=0.0, latency_ms=300, latency_path=r"^/version$")
        t = time.monotonic()
        assert a.get("/version").status_code == 200
        assert time.monotonic() - t >= 0.3
        simw.set_faults(latency_ms=0, drop_rate=1.0, drop_path=r"^/cluster/status$")
        with pytest.raises(httpx.TransportError):
            a.get("/cluster/status")
        simw.set_faults(drop_rate=0.0, offline_nodes=["pve2"])
        nodes = {n["node"]: n for n in a.data("/nodes")}
        assert nodes["pve2"]["status"] == "offline"
        assert a.get("/nodes/pve2/qemu").status_code == 595
        res = {r["id"]: r for r in a.data("/cluster/resources", params={"type": "vm"})}
        assert res["qemu/103"]["status"] == "unknown"
    finally:
        simw.set_faults(error_rate=0.0, latency_ms=0, drop_rate=0.0, offline_nodes=[])
    assert a.get("/nodes/pve2/qemu").status_code == 200


def test_slow_task(simw: SimHandle) -> None:
    a = api(simw)
    simw.set_faults(task_seconds=1.5)
    try:
        upid = a.post("/nodes/pve2/qemu/102/status/start").json()["data"]
        time.sleep(0.8)
        assert a.data(f"/nodes/pve2/tasks/{upid}/status")["status"] == "running"
    finally:
        simw.set_faults(task_seconds=None)


def test_bad_fault_rejected(simw: SimHandle) -> None:
    with pytest.raises(httpx.HTTPStatusError):
        simw.set_faults(no_such_fault=1)


def test_secrets_present_in_state(simw: SimHandle) -> None:
    """Planted secrets exist in the simulator, so gateway tests can prove they never leak."""
    st = simw.state()
    env = [e for g in st["guests"].values() for c in (g["docker"] or []) for e in c["env"]]
    assert "POSTGRES_PASSWORD=SimPlantedSecret-pg-7f3a9c" in env
