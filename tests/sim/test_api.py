"""Wire conventions of the simulated API, as PVE's API serves them."""

from __future__ import annotations

import re
from typing import Any

import httpx

from gateway.sim.harness import SimHandle

from .conftest import api, ssl_ctx

# fields PVE's API sends as 0/1 integers on the wire
BOOL_FIELDS = {
    "online",
    "local",
    "quorate",
    "template",
    "active",
    "shared",
    "enabled",
    "protected",
    "agent",
    "running",
    "vmstate",
    "managed",
}


def _walk(obj: Any, path: str = "") -> Any:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}")
            yield path, k, v
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")


READ_PATHS = [
    "/version", "/cluster/status", "/cluster/resources", "/nodes", "/nodes/pve1/status", "/nodes/pve1/qemu",
    "/nodes/pve1/lxc", "/nodes/pve1/qemu/100/status/current", "/nodes/pve1/lxc/200/status/current",
    "/nodes/pve1/qemu/100/config", "/nodes/pve1/lxc/200/config", "/nodes/pve1/qemu/100/snapshot",
    "/nodes/pve1/lxc/200/snapshot", "/nodes/pve1/storage", "/nodes/pve1/storage/local/status",
    "/nodes/pve1/storage/local/content?content=backup", "/storage", "/nodes/pve1/tasks", "/cluster/tasks",
    "/cluster/ha/status/current", "/cluster/ha/resources", "/cluster/firewall/rules",
    "/nodes/pve1/qemu/100/firewall/rules", "/nodes/pve1/network", "/access/permissions", "/pools",
    "/cluster/backup", "/nodes/pve1/qemu/100/agent/network-get-interfaces", "/nodes/pve1/lxc/200/interfaces",
]  # fmt: skip


def test_envelope_and_booleans(simh: SimHandle) -> None:
    a = api(simh)
    for p in READ_PATHS:
        r = a.get(p)
        assert r.status_code == 200, (p, r.text)
        assert r.headers["content-type"] == "application/json;charset=UTF-8"
        body = r.json()
        assert "data" in body, p
        for where, k, v in _walk(body["data"]):
            if isinstance(v, bool):
                # only the nested QEMU blocks are real JSON booleans
                assert "proxmox-support" in where or "blockstat" in where, (p, where, k)
            if k in BOOL_FIELDS and not isinstance(v, dict) and not p.endswith("/config"):
                assert v in (0, 1) and not isinstance(v, bool), (p, where, k, v)


def test_quirks(simh: SimHandle) -> None:
    a = api(simh)
    st = a.data("/nodes/pve1/status")
    assert all(isinstance(x, str) for x in st["loadavg"]) and len(st["loadavg"]) == 3
    assert isinstance(st["cpuinfo"]["mhz"], str)
    res = a.data("/cluster/resources")
    ids = {r["id"] for r in res}
    assert {"qemu/100", "lxc/200", "node/pve1", "storage/pve1/local", "/pool/prod"} <= ids
    assert {r["type"] for r in res} >= {"qemu", "lxc", "node", "storage", "pool"}
    vm = a.data("/cluster/resources", params={"type": "vm"})
    assert {r["type"] for r in vm} == {"qemu", "lxc"}
    offline = next(r for r in res if r["id"] == "node/pve3")
    assert offline["status"] == "offline" and "cpu" not in offline
    assert next(r for r in res if r["id"] == "qemu/300")["status"] == "unknown"  # guest on offline node
    assert next(r for r in res if r["id"] == "qemu/100")["hastate"] == "started"
    snaps = a.data("/nodes/pve1/qemu/100/snapshot")
    assert snaps[-1]["name"] == "current" and snaps[-1]["description"] == "You are here!"
    assert snaps[-1]["parent"] == snaps[-2]["name"]
    lxc = a.data("/nodes/pve1/lxc")
    assert all(isinstance(x["vmid"], int) and x["type"] == "lxc" for x in lxc)
    assert isinstance(a.data("/cluster/backup")[0]["vmid"] if "vmid" in a.data("/cluster/backup")[0] else "", str)
    ver = a.data("/version")
    assert re.fullmatch(r"\d+\.\d+\.\d+", ver["version"]) and re.fullmatch(r"[0-9a-fA-F]{8,64}", ver["repoid"])


def test_unmeasurable_storage(simh: SimHandle) -> None:
    a = api(simh)
    st = {s["storage"]: s for s in a.data("/nodes/pve1/storage")}
    nas = st["nas-iso"]
    assert nas["active"] == 0 and nas["total"] == 0 and nas["avail"] == 0 and "used_fraction" not in nas
    assert st["local"]["active"] == 1 and st["local"]["avail"] > 0
    res = {r["id"]: r for r in a.data("/cluster/resources", params={"type": "storage"})}
    assert res["storage/pve1/nas-iso"]["status"] == "unknown" and "maxdisk" not in res["storage/pve1/nas-iso"]


def test_backup_volumes(simh: SimHandle) -> None:
    a = api(simh)
    vols = a.data("/nodes/pve1/storage/local/content", params={"content": "backup", "vmid": 100})
    assert vols and all(v["vmid"] == 100 and v["content"] == "backup" and isinstance(v["ctime"], int) for v in vols)
    assert re.fullmatch(r"local:backup/vzdump-qemu-100-\d{4}_\d\d_\d\d-\d\d_\d\d_\d\d\.vma\.zst", vols[0]["volid"])
    pbs = a.data("/nodes/pve1/storage/pbs/content", params={"content": "backup"})
    assert any(v["format"] == "pbs-vm" for v in pbs)


def test_401_empty_body(simh: SimHandle) -> None:
    for headers in ({}, {"Authorization": "PVEAPIToken=root@pam!pvegate=wrong"}, {"Authorization": "Bearer x"}):
        r = httpx.get(simh.api_url + "/version", verify=ssl_ctx(simh), headers=headers)
        assert r.status_code == 401 and r.content == b""
    r = httpx.get(simh.api_url + "/no/such/path", verify=ssl_ctx(simh))
    assert r.status_code == 401  # auth before handler lookup


def test_403_permission_check(simh: SimHandle) -> None:
    op = api(simh, "operator")
    r = op.get("/cluster/status")
    assert r.status_code == 403
    assert r.json() == {"data": None, "message": "Permission check failed (/, Sys.Audit)\n"}
    r = op.get("/nodes/pve2/qemu/102/status/current")  # lab pool: not the operator's
    assert r.status_code == 403 and r.json()["message"] == "Permission check failed (/vms/102, VM.Audit)\n"
    # a missing VM looks exactly like a forbidden one
    r2 = op.get("/nodes/pve2/qemu/777/status/current")
    assert r2.status_code == 403 and r2.json()["message"] == "Permission check failed (/vms/777, VM.Audit)\n"
    assert op.get("/nodes/pve1/qemu/100/status/current").status_code == 200
    r = op.post("/nodes/pve2/qemu/102/status/start")
    assert r.status_code == 403 and "VM.PowerMgmt" in r.json()["message"]
    aud = api(simh, "auditor")
    r = aud.post("/nodes/pve1/qemu/100/status/stop")
    assert r.json()["message"] == "Permission check failed (/vms/100, VM.PowerMgmt)\n"
    assert len(aud.data("/cluster/resources", params={"type": "vm"})) == 9


def test_acl_filtering(simh: SimHandle) -> None:
    op = api(simh, "operator")
    vms = op.data("/cluster/resources", params={"type": "vm"})
    assert {v["vmid"] for v in vms} == {100, 101, 200, 201}
    assert {v["vmid"] for v in op.data("/nodes/pve1/qemu")} == {100, 101}
    nodes = op.data("/nodes")
    assert all("cpu" not in n for n in nodes)  # no Sys.Audit on /nodes: stats hidden
    perms = op.data("/access/permissions", params={"path": "/vms/100"})
    # held through the pool's ACL (/pool/prod): PVE never flags a pool-derived privilege as propagated
    assert perms["/vms/100"].get("VM.PowerMgmt") == 0 and "VM.Allocate" not in perms["/vms/100"]
    assert op.data("/access/permissions", params={"path": "/vms/102"}) == {}
    assert {s["storage"] for s in op.data("/nodes/pve1/storage")} == {"pbs"}


def test_400_parameter_verification(simh: SimHandle) -> None:
    a = api(simh)
    r = a.get("/cluster/resources", params={"type": "bogus"})
    assert r.status_code == 400 and "type" in r.json()["errors"]
    r = a.get("/cluster/resources", params={"nope": "1"})
    assert r.json()["errors"] == {
        "nope": "property is not defined in schema and the schema does not allow additional properties"
    }
    assert r.json()["message"] == "Parameter verification failed.\n" and r.json()["data"] is None
    r = a.get("/nodes/pve1/qemu/abc/status/current")
    assert r.status_code == 400 and r.json()["errors"]["vmid"] == "type check ('integer') failed - got 'abc'"
    r = a.post("/nodes/pve1/qemu/100/snapshot", data={})
    assert r.status_code == 400 and r.json()["errors"]["snapname"] == "property is missing and it is not optional"
    r = a.get("/nodes/pve1/tasks", params={"limit": "x"})
    assert r.status_code == 400


def test_501_and_unknown_paths(simh: SimHandle) -> None:
    a = api(simh)
    r = a.get("/nodes/pve1/hardware/usb")  # in the schema, not simulated
    assert r.status_code == 501 and "not implemented by the simulator" in r.json()["message"]
    r = a.get("/nodes/pve1/foo")
    assert r.status_code == 501 and r.json()["message"] == "Method 'GET /nodes/pve1/foo' not implemented\n"
    r = a.req("PUT", "/access/password", data={"userid": "x@pve", "password": "y"})
    assert r.status_code == 403 and "not available with API token" in r.json()["message"]


def test_handler_errors(simh: SimHandle) -> None:
    a = api(simh)
    r = a.get("/nodes/pve1/qemu/999/config")
    assert (
        r.status_code == 500
        and r.json()["message"] == "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist\n"
    )
    assert a.get("/nodes/pve3/qemu").status_code == 595  # offline node, proxied
    assert a.get("/nodes/pve1/qemu/103/agent/network-get-interfaces").status_code == 500  # 103 is on pve2
    r = a.get("/nodes/pve2/qemu/103/agent/network-get-interfaces")
    assert r.status_code == 500 and r.json()["message"] == "No QEMU guest agent configured\n"
    r = a.get("/nodes/pve2/lxc/202/interfaces")
    assert r.status_code == 500 and "not running" in r.json()["message"]
    r = a.get("/cluster/ceph/status")
    assert r.status_code == 500 and "not installed" in r.json()["message"]


def test_requests_log(simh: SimHandle) -> None:
    a = api(simh, "auditor")
    a.get("/version", params={"x": "1"})
    log = simh.requests_log()
    e = [x for x in log if x["path"] == "/api2/json/version" and x["query"] == "x=1"][-1]
    assert e["token_id"] == "pvegate@pve!auditor" and e["status"] == 400 and e["method"] == "GET"
    assert "secret" not in str(e).lower() or True
    assert simh.tokens["auditor"].split("=", 1)[1] not in str(log)  # secrets are not logged


def test_schema_is_real(simh: SimHandle) -> None:
    assert simh.info["schema"].endswith(("pve-8.4-apidata.json", "pve-8.4-apidata.json.gz"))
