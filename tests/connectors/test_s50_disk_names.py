"""The disk tools refused disk names Proxmox has and the gateway's own tools create.

guest_disk_resize and guest_disk_detach list `virtio0`..`virtio15` in their `disk` pattern but capped
the argument at 6 characters (`virtio0` has 7): a VM's virtio disk could be neither grown nor
detached. Their pattern, and lxc_volume_move's `volume`, spelt the mount points mp0-mp99 and
mp200-mp255 and left out mp100-mp199, although lxc_mountpoint_add puts a mount point at any index up
to 255: one added at mp150 could then be neither grown, moved nor detached through the gateway. A
valid call refused as "invalid" with no way round it (connectors/provision.yaml).

The mount point case runs through the live gateway (HTTPS, JWT, real OPA, the shipped policy) to its
own simulator, whose request log shows what Proxmox received."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.tools.catalog import Catalog
from tests.connectors.test_provision_e2e import API, run
from tests.support import GatewayThread, free_port

CONNECTORS = Path(__file__).resolve().parents[2] / "connectors"
VIRTIO = [f"virtio{i}" for i in range(16)]
MOUNT_POINTS = [f"mp{i}" for i in range(256)]  # lxc_mountpoint_add's index: 0..255


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(CONNECTORS)


@pytest.mark.parametrize("tool", ["guest_disk_resize", "guest_disk_detach"])
def test_every_virtio_disk_and_mount_point_is_a_valid_disk(catalog: Catalog, tool: str) -> None:
    t = catalog.get(tool)
    assert t is not None
    extra = {"grow_gib": 1} if tool == "guest_disk_resize" else {}
    for disk in VIRTIO + MOUNT_POINTS:
        assert t.validate({"vmid": 100, "disk": disk, **extra})["disk"] == disk


def test_every_mount_point_can_be_moved(catalog: Catalog) -> None:
    t = catalog.get("lxc_volume_move")
    assert t is not None
    for volume in MOUNT_POINTS:
        assert t.validate({"vmid": 100, "volume": volume, "storage": "ssd"})["volume"] == volume


@pytest.fixture(scope="module")
def dsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("s50-disk-sim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def denv(dsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("s50-disk-gw"), {"default": dsim}, port=free_port())


@pytest.fixture(scope="module")
def dgw(denv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(denv.config).start()
    yield gw
    gw.stop()


async def test_a_mount_point_added_at_mp150_can_be_grown_moved_and_detached(
    dgw: GatewayThread, denv: DevEnv, dsim: Any
) -> None:
    # a stopped one: Proxmox moves no volume of a running container
    guests = dsim.state()["guests"].items()
    vmid, row = next((int(k), g) for k, g in guests if g.get("type") == "lxc" and g.get("status") == "stopped")
    node = row["node"]
    config = f"{API}/{node}/lxc/{vmid}/config"
    await run(
        dgw, denv, dsim, "lxc_mountpoint_add",
        {"vmid": vmid, "index": 150, "storage": "local-lvm", "disk_gib": 1, "path": "/srv/s50"},
        ("PUT", config, {"mp150": "local-lvm:1,mp=/srv/s50"}),
    )  # fmt: skip
    await run(
        dgw, denv, dsim, "guest_disk_resize", {"vmid": vmid, "disk": "mp150", "grow_gib": 1},
        ("PUT", f"{API}/{node}/lxc/{vmid}/resize", {"disk": "mp150", "size": "+1G"}),
    )  # fmt: skip
    await run(
        dgw, denv, dsim, "lxc_volume_move", {"vmid": vmid, "volume": "mp150", "storage": "ssd", "delete_source": True},
        ("POST", f"{API}/{node}/lxc/{vmid}/move_volume", {"volume": "mp150", "storage": "ssd", "delete": "1"}),
    )  # fmt: skip
    detach = ("PUT", config, {"delete": "mp150"})
    await run(dgw, denv, dsim, "guest_disk_detach", {"vmid": vmid, "disk": "mp150"}, detach)
    assert "mp150" not in dsim.state()["guests"][str(vmid)]["config"]
