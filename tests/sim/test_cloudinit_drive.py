"""A new cloud-init drive (`ide0: local-lvm:cloudinit`, as vm_create sends it) is recorded as
Proxmox records it: an allocated vm-N-cloudinit volume on a CD-ROM drive. The gateway sizes
guests from their configs (the resource quotas' pool usage): a drive left as the create's
`local-lvm:cloudinit`, with no size and no media=cdrom, read as a disk of unknown size."""

from __future__ import annotations

from gateway.sim import disks
from gateway.sim.state import Cluster, Guest, Storage
from gateway.tools.targets import guest_size


def test_a_new_cloudinit_drive_is_a_cdrom() -> None:
    cl = Cluster(name="c", storages={"local-lvm": Storage(id="local-lvm", type="lvmthin", content=["images"])})
    g = Guest(vmid=180, type="qemu", node="pve1", name="ci")
    disks.set_key(cl, g, "ide0", "local-lvm:cloudinit")
    disks.set_key(cl, g, "scsi0", "local-lvm:4")
    assert g.config["ide0"] == "local-lvm:vm-180-cloudinit,media=cdrom"
    assert guest_size("qemu", g.config)["disk_gib"] == 4  # the CD-ROM is no disk; scsi0 is
