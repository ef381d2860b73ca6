"""A download's credentials never leave a task log or a task status.

PVE's download-url task logs the URL it was given, verbatim ("starting file import from:
https://user:password@host/x.iso", "downloading ... to ..."), and a failed download's exit
status quotes it too. The gateway's own storage_download_url refuses a URL with userinfo, but
an operator may start one in the web UI with a mirror's credentials in it: get_task_log,
task_log_page, task_log_tail and get_task_status handed the password to any agent that may
read tasks, as node_apt_repositories does not.
"""

from __future__ import annotations

import ssl
import time
from typing import Any

import httpx

from gateway.dev.devenv import DevEnv
from tests.connectors.test_provision_e2e import read
from tests.support import GatewayThread

SECRET = "Mirr0rPassw0rd-s48"  # planted: no tool may show it
HOST_PATH = "cdimage.debian.org/debian-cd/current/amd64/iso-cd/debian-12.8.0-amd64-netinst.iso"


def _download(sim: Any, url: str, filename: str) -> str:
    """Started past the gateway, as an operator would in the web UI: the task's UPID."""
    ctx = ssl.create_default_context(cafile=str(sim.ca_file))
    headers = {"Authorization": "PVEAPIToken=" + sim.tokens["admin"]}
    with httpx.Client(base_url=sim.api_url.rstrip("/"), headers=headers, verify=ctx, timeout=10) as http:
        body = {"url": url, "content": "iso", "filename": filename}
        r = http.post("/nodes/pve1/storage/local/download-url", data=body)
        assert r.status_code == 200, r.text[:300]
        upid = str(r.json()["data"])
        deadline = time.monotonic() + 15
        while http.get(f"/nodes/pve1/tasks/{upid}/status").json()["data"]["status"] != "stopped":
            assert time.monotonic() < deadline, upid
            time.sleep(0.05)
    return upid


async def test_task_logs_and_status_hide_a_urls_credentials(gateway: GatewayThread, env: DevEnv, sim: Any) -> None:
    ok = _download(sim, f"https://mirror:{SECRET}@{HOST_PATH}", "s48-ok.iso")
    failed = _download(sim, f"https://mirror:{SECRET}@{HOST_PATH}.missing", "s48-missing.iso")

    log = await read(env, "get_task_log", {"upid": ok})
    page = await read(env, "task_log_page", {"upid": ok, "start": 0, "limit": 50})
    tail = await read(env, "task_log_tail", {"upid": ok, "lines": 50})
    status = await read(env, "get_task_status", {"upid": failed})
    flog = await read(env, "get_task_log", {"upid": failed})
    for out in (log, page, tail, status, flog):
        assert SECRET not in str(out) and "mirror:" not in str(out), out
    # the lines themselves are still there, the URL without its userinfo
    texts = [r["t"] for r in log["items"]]
    assert f"starting file import from: https://***@{HOST_PATH}" in texts, texts
    assert page["total"] == len(texts) and [r["t"] for r in page["items"]] == texts
    assert [r["t"] for r in tail["lines"]] == texts
    assert f"https://***@{HOST_PATH}.missing" in str(status["exitstatus"]), status
