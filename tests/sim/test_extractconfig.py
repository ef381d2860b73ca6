"""GET /nodes/{node}/vzdump/extractconfig: the configuration a backup holds, as text, with
PVE's permission checks (check_volume_access, then VM.Backup on the backed-up guest) and
PVE's answers for a backup the node cannot reach."""

from __future__ import annotations

from gateway.sim.handlers_backup import config_file
from gateway.sim.harness import SimHandle
from gateway.tools.targets import config_text

from .conftest import api

PATH = "/nodes/{}/vzdump/extractconfig"


def backups(simh: SimHandle, node: str, storage: str) -> dict[int, str]:
    rows = api(simh).data(f"/nodes/{node}/storage/{storage}/content", params={"content": "backup"})
    return {int(r["vmid"]): str(r["volid"]) for r in rows}


def test_a_vms_backup_config_as_vzdump_wrote_it(simh: SimHandle) -> None:
    a = api(simh)
    volid = backups(simh, "pve1", "local")[100]
    text = a.data(PATH.format("pve1"), params={"volume": volid})
    assert isinstance(text, str) and text.endswith("\n")
    lines = text.splitlines()
    # the settings sorted by key, then one map line per disk in the archive (the CD-ROM is none)
    assert lines[-1] == "#qmdump#map:scsi0:drive-scsi0:local-lvm:raw:"
    assert lines[:-1] == sorted(lines[:-1])
    assert "scsi0: local-lvm:vm-100-disk-0,iothread=1,size=32G" in lines and "ide2: none,media=cdrom" in lines
    # what the guest's config held when it was backed up (the scenario's backup: its config at start)
    config = {k: str(v) for k, v in a.data("/nodes/pve1/qemu/100/config").items() if k != "digest"}
    assert config_text(text) == config


def test_a_containers_backup_config_and_a_pbs_snapshot(simh: SimHandle) -> None:
    volid = backups(simh, "pve1", "pbs")[200]
    assert volid.startswith("pbs:backup/ct/200/")
    text = api(simh).data(PATH.format("pve2"), params={"volume": volid})  # shared: any node reads it
    config = config_text(text)
    assert (config["cores"], config["memory"], config["swap"]) == ("2", "4096", "512")
    assert config["rootfs"].endswith(",size=20G") and "#qmdump#" not in text


def test_the_description_is_written_as_pve_writes_it() -> None:
    assert config_file({"cores": 1, "description": "web: front\nsecond line", "digest": "x"}) == (
        "#web%3A front\n#second line\ncores: 1\n"
    )


def test_permissions_and_unreachable_backups(simh: SimHandle) -> None:
    prod = backups(simh, "pve1", "pbs")[101]
    lab = backups(simh, "pve2", "local")[103]
    # the operator token: VM.Backup on pool prod's guests, Datastore.AllocateSpace on pbs only
    op = api(simh, "operator")
    r = op.get(PATH.format("pve1"), params={"volume": prod})
    assert r.status_code == 200 and "name: db01" in r.json()["data"]
    r = op.get(PATH.format("pve2"), params={"volume": lab})
    assert r.status_code == 403 and "(/storage/local, Datastore.AllocateSpace)" in r.json()["message"]
    r = api(simh, "auditor").get(PATH.format("pve1"), params={"volume": prod})
    assert r.status_code == 403

    a = api(simh)
    r = a.get(PATH.format("pve1"), params={"volume": lab})  # pve2's local storage is not pve1's
    assert r.status_code == 500 and r.json()["message"] == f"can't find file '{lab}'\n"
    r = a.get(PATH.format("pve1"), params={"volume": "nosuch:backup/vzdump-qemu-100-2024_01_01-00_00_00.vma.zst"})
    assert r.status_code == 500 and "storage 'nosuch' does not exist" in r.json()["message"]
    r = a.get(PATH.format("pve1"))
    assert r.status_code == 400 and "volume" in r.json()["errors"]
