"""The simulator refuses a request body on DELETE and GET as Proxmox does.

pve-http-server reads parameters from the body of a POST or PUT only; a DELETE or GET that
carries content is answered `501 Unexpected content for method 'DELETE'` before any handler
runs (PVE/APIServer/AnyEvent.pm, process_header). The simulator read such a body as nothing
and ran the request without it: a DELETE whose parameters a connector put in the body (a
firewall rule's `digest`, a snapshot's `force`) was carried out with them silently dropped,
and the request log shows no body for a DELETE, so no test could tell. Proxmox runs nothing.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx


def _client(sim: Any) -> httpx.Client:
    tls = ssl.create_default_context(cafile=str(sim.ca_file))
    return httpx.Client(verify=tls, headers={"Authorization": f"PVEAPIToken={sim.tokens['admin']}"})


def _snapshots(c: httpx.Client, sim: Any) -> set[str]:
    r = c.get(f"{sim.api_url}/nodes/pve1/qemu/100/snapshot")
    assert r.status_code == 200, r.text
    return {s["name"] for s in r.json()["data"]}


def test_a_delete_with_a_body_is_refused_and_nothing_is_deleted(fsim: Any) -> None:
    with _client(fsim) as c:
        assert "pre_upgrade" in _snapshots(c, fsim)
        r = c.request("DELETE", f"{fsim.api_url}/nodes/pve1/qemu/100/snapshot/pre_upgrade", data={"force": "1"})
        assert r.status_code == 501, r.text
        assert "Unexpected content for method 'DELETE'" in r.reason_phrase + r.text
        assert "pre_upgrade" in _snapshots(c, fsim)  # nothing ran
        # the same request with its parameter where Proxmox reads it (the query) is carried out
        r = c.request("DELETE", f"{fsim.api_url}/nodes/pve1/qemu/100/snapshot/pre_upgrade", params={"force": "1"})
        assert r.status_code == 200, r.text


def test_a_get_with_a_body_is_refused(fsim: Any) -> None:
    with _client(fsim) as c:
        r = c.request("GET", f"{fsim.api_url}/nodes/pve1/qemu/100/config", content=b"current=1")
        assert r.status_code == 501, r.text
        r = c.request("GET", f"{fsim.api_url}/nodes/pve1/qemu/100/config", params={"current": "1"})
        assert r.status_code == 200, r.text
