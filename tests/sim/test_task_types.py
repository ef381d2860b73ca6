"""Every task type a tool declares (`task_type`, what reconciliation looks for when a call's UPID was
lost) is the type the simulator's UPID carries for it: power actions on VMs and containers, with and
without HA, and snapshots, each sent to the simulator as the tool's own method and path."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.sim.harness import SimHandle
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.pve_api import UPID_RE

CONNECTORS = Path(__file__).resolve().parents[2] / "connectors"

# (tool, node, guest type, vmid, extra fields): in order, each on the state the one before left
CALLS: list[tuple[str, str, str, int, dict[str, Any]]] = [
    ("vm_start", "pve2", "qemu", 102, {}),
    ("vm_suspend", "pve2", "qemu", 102, {}),
    ("vm_resume", "pve2", "qemu", 102, {}),
    ("vm_reboot", "pve2", "qemu", 102, {}),
    ("vm_shutdown", "pve2", "qemu", 102, {}),
    ("vm_start", "pve2", "qemu", 102, {}),
    ("vm_stop", "pve2", "qemu", 102, {}),
    ("vm_stop", "pve1", "qemu", 100, {}),  # HA-managed: hastop
    ("vm_start", "pve1", "qemu", 100, {}),  # hastart
    ("vm_shutdown", "pve1", "qemu", 100, {}),  # hastop
    ("lxc_start", "pve2", "lxc", 202, {}),
    ("lxc_suspend", "pve2", "lxc", 202, {}),
    ("lxc_resume", "pve2", "lxc", 202, {}),
    ("lxc_reboot", "pve2", "lxc", 202, {}),
    ("lxc_shutdown", "pve2", "lxc", 202, {}),
    ("lxc_start", "pve2", "lxc", 202, {}),
    ("lxc_stop", "pve2", "lxc", 202, {}),
    ("lxc_stop", "pve2", "lxc", 201, {}),  # HA-managed
    ("lxc_start", "pve2", "lxc", 201, {}),
    ("snapshot_create", "pve2", "qemu", 102, {"snapname": "tt1"}),
    ("snapshot_rollback", "pve2", "qemu", 102, {"snapname": "tt1"}),
    ("snapshot_delete", "pve2", "qemu", 102, {"snapname": "tt1"}),
    ("snapshot_create", "pve2", "lxc", 202, {"snapname": "tt1"}),
    ("snapshot_rollback", "pve2", "lxc", 202, {"snapname": "tt1"}),
    ("snapshot_delete", "pve2", "lxc", 202, {"snapname": "tt1"}),
]


def test_declared_task_types_are_the_simulators(simw: SimHandle) -> None:
    catalog = Catalog.load(CONNECTORS)
    simw.set_faults(task_seconds=0.05)
    ctx = ssl.create_default_context(cafile=str(simw.ca_file))
    headers = {"Authorization": "PVEAPIToken=" + simw.tokens["admin"]}
    seen: list[tuple[str, str]] = []
    with httpx.Client(base_url=simw.api_url.rstrip("/"), headers=headers, verify=ctx, timeout=10) as http:
        for name, node, kind, vmid, extra in CALLS:
            tool = catalog.get(name)
            assert tool is not None and tool.spec.get("task") and tool.task_types, name
            values = {"node": node, "type": kind, "vmid": vmid, **extra}
            path = tool.spec["path"].format(**values)
            data = {"snapname": extra["snapname"]} if name == "snapshot_create" else None
            r = http.request(tool.spec["method"], path, data=data)
            assert r.status_code == 200, (name, path, r.text[:300])
            upid = r.json()["data"]
            m = UPID_RE.fullmatch(upid)
            assert m is not None, (name, upid)
            seen.append((name, m.group(6)))
            assert m.group(6) in tool.task_types, (name, m.group(6), tool.task_types)
            deadline = time.monotonic() + 10
            while http.get(f"/nodes/{node}/tasks/{upid}/status").json()["data"]["status"] != "stopped":
                assert time.monotonic() < deadline, (name, upid)
                time.sleep(0.05)
    # HA-managed guests' power actions are the HA manager's tasks
    assert ("vm_start", "hastart") in seen and ("vm_stop", "hastop") in seen and ("lxc_stop", "hastop") in seen
