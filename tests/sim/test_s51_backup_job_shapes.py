"""The simulator answered a backup job's retention as the property string it was given, and had no
GET /nodes/{node}/vzdump/defaults.

Real Proxmox decodes a job's `prune-backups` (and `performance`, `fleecing`) when it reads jobs.cfg
(PVE::VZDump::JobBase decode_value over PVE::VZDump::Common::$PROPERTY_STRINGS): GET /cluster/backup
and GET /cluster/backup/{id} answer `{"keep-daily": 7, "keep-weekly": 4}`, which the 9.1 schema
types `object`. A gateway tested only on the string could read a real job's retention as "none"
(keeps every backup). And a run without a retention of its own or its storage's prunes by the node's
/etc/vzdump.conf (PVE::VZDump `new`), which Proxmox answers at GET /nodes/{node}/vzdump/defaults:
the simulator must serve it (as a property string) for the gateway to read it.
"""

from __future__ import annotations

from gateway.sim.harness import SimHandle

from .conftest import api


def test_a_jobs_retention_is_answered_as_an_object(simh: SimHandle) -> None:
    one = api(simh).data("/cluster/backup/backup-prod-nightly")
    assert one["prune-backups"] == {"keep-daily": 7, "keep-weekly": 4}, one
    listed = {j["id"]: j for j in api(simh).data("/cluster/backup")}
    assert listed["backup-prod-nightly"]["prune-backups"] == {"keep-daily": 7, "keep-weekly": 4}
    assert "prune-backups" not in listed["backup-lab-weekly"]  # no retention of its own: none shown
    assert listed["backup-lab-weekly"]["vmid"] == "102,103"  # a comma-separated string, as PVE


def test_vzdump_defaults_answer_the_retention_that_applies(simh: SimHandle) -> None:
    got = api(simh).data("/nodes/pve1/vzdump/defaults", params={"storage": "local"})
    assert got["storage"] == "local" and got["prune-backups"] == "keep-all=1", got  # a string here
    assert got["remove"] == 1 and got["mode"] == "snapshot"
    assert api(simh, "auditor").data("/nodes/pve2/vzdump/defaults", params={"storage": "pbs"})["prune-backups"]
    # Datastore.Audit or .AllocateSpace on the storage: the operator token has neither on local
    denied = api(simh, "operator").get("/nodes/pve1/vzdump/defaults", params={"storage": "local"})
    assert denied.status_code == 403, denied.text
    # the answer comes from the node itself: an offline one cannot be asked
    assert api(simh).get("/nodes/pve3/vzdump/defaults", params={"storage": "local"}).status_code >= 500
