"""The second (PVE 9.1, Ceph) cluster: version-specific shapes and privileges."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.sim.harness import SimHandle, start_simulator

from .conftest import api


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimHandle]:
    h = start_simulator("second", tmp_path_factory.mktemp("sim-edge"), ssh=False)
    yield h
    h.stop()


def test_pve9_shapes(edge: SimHandle) -> None:
    a = api(edge)
    assert edge.info["schema"].endswith(("pve-9.1-apidata.json", "pve-9.1-apidata.json.gz"))
    assert a.data("/version")["release"] == "9.1"
    ha = a.data("/cluster/ha/status/current")
    assert any(r["type"] == "fencing" and r["armed-state"] == "armed" for r in ha)
    assert all("failback" in r for r in ha if r["type"] == "service")
    ceph = a.data("/cluster/ceph/status")
    assert ceph["health"]["status"] == "HEALTH_WARN"
    assert a.data("/nodes/edge1/ceph/status")["fsid"] == ceph["fsid"]
    vms = a.data("/nodes/edge1/qemu")
    assert all("qmpstatus" in v for v in vms)
    assert a.get("/nodes/edge1/lxc/200/migrate").status_code == 200  # 9.1-only endpoint
    # 9.x guest agent privilege
    aud = api(edge, "auditor")
    r = aud.get("/nodes/edge1/qemu/100/agent/network-get-interfaces")
    assert r.status_code == 200
    perms = aud.data("/access/permissions", params={"path": "/"})
    assert "VM.GuestAgent.Audit" in perms["/"] and "VM.Monitor" not in perms["/"]
