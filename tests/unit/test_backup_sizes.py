"""The size of the guest a backup holds, as the resource quotas count it: a backup's config text
(GET /nodes/{node}/vzdump/extractconfig) read like GET .../config, and counted as a create
counts its arguments. What cannot be read or counted raises: the gateway then hands the
policy `final: null`, which it refuses."""

from __future__ import annotations

import pytest

from gateway.tools.targets import config_text, guest_size

VMA = """#web front end
#second%3A line
agent: 1
cores: 4
efidisk0: local-lvm:vm-100-disk-1,efitype=4m,pre-enrolled-keys=1,size=4M
ide0: local-lvm:vm-100-cloudinit,media=cdrom,size=4M
ide2: local:iso/debian.iso,media=cdrom,size=600M
memory: current=8192
net0: virtio=BC:24:11:00:00:01,bridge=vmbr0
scsi0: local-lvm:vm-100-disk-0,iothread=1,size=32G
scsi1: ceph:vm-100-disk-2,size=1T
sata0: none,media=cdrom
sockets: 2
virtio1: local-lvm:vm-100-disk-3,backup=0,size=512M
#qmdump#map:efidisk0:drive-efidisk0:local-lvm:raw:
#qmdump#map:scsi0:drive-scsi0:local-lvm:raw:
#qmdump#map:scsi1:drive-scsi1:ceph:raw:

[pre_upgrade]
cores: 64
scsi2: local-lvm:vm-100-disk-9,size=9T
"""

PCT = """arch: amd64
cores: 2
hostname: ct01
lxc.cgroup2.devices.allow: c 10:200 rwm
memory: 2048
mp0: local-lvm:vm-200-disk-1,mp=/srv,size=50G
mp1: /mnt/host,mp=/host
rootfs: local-lvm:vm-200-disk-0,size=8G
unused0: local-lvm:vm-200-disk-7
"""


def test_a_vms_backup() -> None:
    config = config_text(VMA)
    assert config["cores"] == "4" and "scsi2" not in config  # the snapshot section is no setting
    assert config["sockets"] == "2"
    # 4 cores on each of 2 sockets; memory given as current=; every disk but the CD-ROMs, the
    # backup=0 drive too (counted, not guessed away): 32 GiB + 1 TiB + 512 MiB + 4 MiB, rounded up
    assert guest_size("qemu", config) == {"cores": 8, "memory_mib": 8192, "disk_gib": 32 + 1024 + 1}


def test_a_containers_backup() -> None:
    config = config_text(PCT)
    assert config["lxc.cgroup2.devices.allow"] == "c 10:200 rwm"
    # memory plus PVE's default swap; a bind mount allocates nothing; unused volumes are not restored
    assert guest_size("lxc", config) == {"cores": 2, "memory_mib": 2048 + 512, "disk_gib": 58}
    assert guest_size("lxc", {**config, "swap": "0"})["memory_mib"] == 2048


def test_defaults_are_proxmoxs() -> None:
    assert guest_size("qemu", config_text("name: tiny\n")) == {"cores": 1, "memory_mib": 512, "disk_gib": 0}
    # a container without cores may use every core of its node: that is what it asks for
    bare = config_text("hostname: ct\nrootfs: local-lvm:vm-1-disk-0,size=1G\n")
    assert guest_size("lxc", bare, node_cpus=16) == {"cores": 16, "memory_mib": 1024, "disk_gib": 1}
    with pytest.raises(ValueError):
        guest_size("lxc", bare)  # the node's cores unknown: not counted as 0


@pytest.mark.parametrize("sep", ["\u2028", "\x85", "\x0b", "\x1c", "\r"])
def test_only_a_newline_ends_a_line(sep: str) -> None:
    """Proxmox splits a configuration on newlines only; a description holding another line
    separator (its `#` line) read as two lines ended the settings at a fake section, or added one."""
    text = f"#note{sep}[fake]\n#x{sep}scsi9: local:vm-1-disk-9,size=9T\ncores: 2\nscsi0: local:vm-1-disk-0,size=1G\n"
    config = config_text(text)
    assert config == {"cores": "2", "scsi0": "local:vm-1-disk-0,size=1G"}
    assert guest_size("qemu", config)["disk_gib"] == 1


@pytest.mark.parametrize(
    "text",
    [None, {"cores": 4}, "", "#only a description\n", "[snap]\ncores: 1\n", "cores 4\n", "Cores: 4\n"],
    ids=["null", "json", "empty", "comments", "section first", "no colon", "bad key"],
)
def test_an_unreadable_config_raises(text: object) -> None:
    with pytest.raises(ValueError):
        config_text(text)


@pytest.mark.parametrize(
    "line",
    ["scsi0: local-lvm:vm-1-disk-0", "scsi0: local-lvm:vm-1-disk-0,size=big", "scsi0: /dev/sdb"],
    ids=["no size", "bad size", "passthrough"],
)
def test_a_disk_of_unknown_size_raises(line: str) -> None:
    with pytest.raises(ValueError):
        guest_size("qemu", config_text(f"cores: 1\n{line}\n"))
