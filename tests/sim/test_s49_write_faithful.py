"""The simulator's write and SSH side was more lenient than Proxmox, which hid client mistakes.

- `agent` counted as enabled only when its first item was "1" or "enabled=1"; PVE's `enabled` is the
  default key of a property string (any bare item, or `enabled=` anywhere), a PVE boolean (1, yes,
  on, true in any case): a VM set `agent: fstrim_cloned_disks=1,enabled=yes` had no agent here.
- property strings (`agent`, `netN`, `scsiN`, ...) were not checked at all: PVE answers 400
  "Parameter verification failed." with `invalid format - ...` for `agent=maybe` or `tag=0`; the
  simulator stored them.
- `delete` of an option also set, or of an option PVE does not know, and `revert` of one also set,
  are 400 parameter errors in PVE (checked before anything changes); the simulator answered 500 after
  applying the deletes before it, or ignored the unknown option.
- `skiplock` is root@pam's alone: an API token gets a 400; the simulator let any token skip a lock.
- `pct exec` of a program the container lacks exits 127 (lxc_attach_run_command on ENOENT), not 255.
- `pct resume` of a stopped container is refused at once ("CT N not running").
"""

from __future__ import annotations

from gateway.sim.handlers_write import agent_enabled, sync_from_config
from gateway.sim.harness import SimHandle
from gateway.sim.schema import ParamError, Schema
from gateway.sim.state import Cluster, Guest

from .conftest import api
from .test_tasks import upid_of, wait_task


def test_agent_enabled_reads_the_property_string_as_pve_does() -> None:
    for on in ("1", "true", "YES", "On", "enabled=1", "fstrim_cloned_disks=1,enabled=yes", "type=isa,1"):
        assert agent_enabled(on), on
    for off in (None, "", "0", "off", "enabled=0", "enabled=no,fstrim_cloned_disks=1", "type=virtio"):
        assert not agent_enabled(off), off
    g = Guest(vmid=1, type="qemu", node="pve1", name="x", config={"agent": "fstrim_cloned_disks=1,enabled=true"})
    sync_from_config(g)
    assert g.agent
    Cluster(name="c")  # the state module stays importable beside the handlers


def test_property_strings_are_verified() -> None:
    s = Schema.load(None, 8)
    ep = s.by_template[("PUT", "/nodes/{node}/qemu/{vmid}/config")]
    base = {"node": "pve1", "vmid": "100"}
    for key, bad, part in (
        ("agent", "maybe", "agent.enabled: type check ('boolean') failed - got 'maybe'"),
        ("agent", "foo=1", "invalid key in comma-separated list property: foo"),
        ("net0", "virtio,bridge=vmbr0,tag=0", "net0.tag: value must have a minimum value of 1"),
        ("net0", "virtio,e1000", "duplicate key in comma-separated list property: model"),
    ):
        try:
            s.validate(ep, {**base, key: bad})
        except ParamError as e:
            assert e.errors[key].startswith("invalid format - ") and part in e.errors[key], e.errors
        else:
            raise AssertionError(f"{key}={bad} accepted")
    for key, good in (
        ("agent", "type=isa,enabled=yes"),
        ("net0", "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1"),
        ("scsi1", "local-lvm:32,iothread=1"),
        ("ipconfig0", "ip=10.0.0.5/24,gw=10.0.0.1"),
    ):
        assert s.validate(ep, {**base, key: good})[key] == good


def test_config_update_refusals_are_400s_and_change_nothing(simw: SimHandle) -> None:
    a = api(simw)
    path = "/nodes/pve2/qemu/102/config"
    before = a.data(path)
    r = a.req("PUT", path, data={"agent": "maybe"})
    assert r.status_code == 400 and "agent" in r.json()["errors"], r.text
    r = a.req("PUT", path, data={"delete": "description,cores", "cores": "2"})
    assert r.status_code == 400, r.text
    assert "-delete cores" in r.json()["errors"]["delete"]
    r = a.req("PUT", path, data={"delete": "nosuchoption"})
    assert r.status_code == 400 and r.json()["errors"]["delete"] == "unknown option 'nosuchoption'", r.text
    r = a.req("PUT", path, data={"revert": "cores", "cores": "2"})
    assert r.status_code == 400 and "revert" in r.json()["errors"], r.text
    r = a.req("PUT", path, data={"skiplock": "1", "description": "x"})
    assert r.status_code == 400 and r.json()["errors"]["skiplock"] == "Only root may use this option.", r.text
    r = a.req("DELETE", "/nodes/pve2/qemu/102", params={"skiplock": "1"})
    assert r.status_code == 400 and "skiplock" in r.json()["errors"], r.text
    assert a.data(path) == before  # nothing of the refused requests was applied


def test_an_agent_enabled_later_in_the_string_is_an_agent(simw: SimHandle) -> None:
    a = api(simw)
    r = a.req("PUT", "/nodes/pve2/qemu/102/config", data={"agent": "fstrim_cloned_disks=1,enabled=yes"})
    assert r.status_code == 200, r.text
    assert wait_task(a, upid_of(a.post("/nodes/pve2/qemu/102/status/start")))["exitstatus"] == "OK"
    assert a.data("/nodes/pve2/qemu/102/status/current")["agent"] == 1
    r = a.get("/nodes/pve2/qemu/102/agent/network-get-interfaces")
    assert r.status_code == 200, r.text


def test_pct_resume_of_a_stopped_container_is_refused(simw: SimHandle) -> None:
    r = api(simw).post("/nodes/pve2/lxc/202/status/resume")
    assert r.status_code == 500 and r.json()["message"] == "CT 202 not running\n", r.text


async def test_pct_exec_of_a_missing_program_exits_127(simh: SimHandle) -> None:
    from .test_ssh import run

    r = await run(simh, "pct exec 201 -- nosuchprogram --version", node="pve2")
    assert r.exit_status == 127 and 'Failed to exec "nosuchprogram"' in str(r.stderr), r
