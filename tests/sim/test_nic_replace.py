"""Setting a guest's netN replaces the whole line, as Proxmox does: a flag the new line leaves out
(firewall=1, tag=...) is gone, and a line that names no MAC gets a new one. qemu-server's
update_vm_api runs every netN through parse_net, which draws a random MAC when the line has none;
pve-container's parse_lxc_network does the same for hwaddr. The interface's old MAC is not kept:
the gateway's NIC tools are tested against this (tests/connectors/test_nic_firewall_e2e.py)."""

from __future__ import annotations

from gateway.sim import disks
from gateway.sim.state import Cluster, Guest


def test_a_vm_nic_set_replaces_the_line_and_draws_a_new_mac() -> None:
    cl = Cluster(name="c")
    g = Guest(vmid=180, type="qemu", node="pve1", name="ci", status="running")
    disks.set_key(cl, g, "net0", "virtio,bridge=vmbr0,tag=20,firewall=1")
    first = g.config["net0"]
    assert first.startswith("virtio=BC:24:11:") and first.endswith(",bridge=vmbr0,tag=20,firewall=1")
    old_mac = first.split(",")[0].split("=")[1]

    disks.set_key(cl, g, "net0", "virtio,bridge=vmbr1")
    line = g.config["net0"]
    model, _, rest = line.partition(",")
    assert rest == "bridge=vmbr1"  # no firewall, no tag: nothing of the old line is kept ...
    assert model.startswith("virtio=BC:24:11:") and model != f"virtio={old_mac}"  # ... not even the MAC
    assert g.pending == {}  # a NIC is hot-plugged

    # a MAC the caller names is the MAC set
    disks.set_key(cl, g, "net0", f"e1000={old_mac},bridge=vmbr0")
    assert g.config["net0"] == f"e1000={old_mac},bridge=vmbr0"
    disks.set_key(cl, g, "net1", f"virtio,bridge=vmbr0,macaddr={old_mac}")
    assert g.config["net1"] == f"virtio,bridge=vmbr0,macaddr={old_mac}"


def test_a_new_nic_gets_a_mac_no_other_interface_has() -> None:
    g = Guest(vmid=181, type="qemu", node="pve1", name="ci")
    g.config["net0"] = f"virtio={disks.mac(181, 1)},bridge=vmbr0"  # the MAC net1 would draw first
    disks.set_key(Cluster(name="c"), g, "net1", "virtio,bridge=vmbr0")
    assert disks.mac(181, 1) not in g.config["net1"]


def test_a_container_nic_set_replaces_the_line_and_draws_a_new_hwaddr() -> None:
    cl = Cluster(name="c")
    g = Guest(vmid=280, type="lxc", node="pve1", name="ct")
    disks.set_key(cl, g, "net0", "name=eth0,bridge=vmbr0,ip=dhcp,firewall=1,hwaddr=BC:24:11:00:00:01")
    assert g.config["net0"] == "name=eth0,bridge=vmbr0,ip=dhcp,firewall=1,hwaddr=BC:24:11:00:00:01"

    disks.set_key(cl, g, "net0", "name=eth0,bridge=vmbr0")
    options = g.config["net0"].split(",")
    assert options[:2] == ["name=eth0", "bridge=vmbr0"] and len(options) == 3  # no ip, no firewall
    assert options[2].startswith("hwaddr=BC:24:11:") and options[2] != "hwaddr=BC:24:11:00:00:01"
