"""A download's credentials never leave the cluster log, a node's syslog or its journal.

PVE logs every task's end as `end task <UPID> <exit status>`, to the cluster log and (log_msg, as
`pvedaemon[pid]: <user> end task ...`) to the node's syslog, and a failed download-url task's exit
status quotes the URL it was given, userinfo and all. An operator may start one in the web UI with a
mirror's credentials in the URL: the task tools lose them (test_s48, test_s49), but cluster_log,
node_syslog and node_journal returned the lines verbatim and handed the password to any agent that may
read logs. Real simulator (its syslog now carries the task lines PVE writes there), real OPA, the
gateway over HTTPS.
"""

from __future__ import annotations

from typing import Any

from gateway.dev.devenv import DevEnv
from tests.connectors.test_provision_e2e import read
from tests.connectors.test_s48_task_log_userinfo import HOST_PATH, _download
from tests.support import GatewayThread

SECRET = "Mirr0rPassw0rd-s50"  # planted: no tool may show it


async def test_the_cluster_log_hides_a_failed_downloads_credentials(
    gateway: GatewayThread, env: DevEnv, sim: Any
) -> None:
    upid = _download(sim, f"https://mirror:{SECRET}@{HOST_PATH}.missing", "s50-missing.iso")
    log = await read(env, "cluster_log", {"max": 500})
    assert SECRET not in str(log) and "mirror:" not in str(log), log
    # the entry itself is still there, the URL without its userinfo
    ends = [r["msg"] for r in log["items"] if str(r.get("msg", "")).startswith(f"end task {upid}")]
    assert len(ends) == 1 and f"https://***@{HOST_PATH}.missing" in ends[0], ends


async def test_a_nodes_syslog_and_journal_hide_a_failed_downloads_credentials(
    gateway: GatewayThread, env: DevEnv, sim: Any
) -> None:
    upid = _download(sim, f"https://mirror:{SECRET}@{HOST_PATH}.missing", "s50-missing-2.iso")
    syslog = await read(env, "node_syslog", {"node": "pve1", "service": "pvedaemon", "limit": 500})
    journal = await read(env, "node_journal", {"node": "pve1", "lastentries": 500})
    for out in (syslog, journal):
        assert SECRET not in str(out) and "mirror:" not in str(out), out
    lines = [*(r["t"] for r in syslog["items"]), *journal["lines"]]
    ends = [line for line in lines if f"end task {upid}" in line]
    assert len(ends) == 2 and all(f"https://***@{HOST_PATH}.missing" in line for line in ends), ends
