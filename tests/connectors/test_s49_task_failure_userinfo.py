"""A failed task's error never carries a URL's credentials.

When the gateway waits on a task and it fails, the error it returns quotes Proxmox's exit status. A failed
download's exit status quotes the URL it was given, userinfo and all (test_s48_task_log_userinfo.py took
them out of the task tools' answers, not out of this error). Upstream text on its way into any error now
loses every URL's userinfo, as it loses the gateway's token. Real simulator."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from gateway.tools.runtimes.base import TaskFailed
from gateway.tools.runtimes.pve_api import PveApiClient, PveApiRuntime
from gateway.tools.targets import TargetResolver
from tests.connectors.test_runtimes import _cluster
from tests.connectors.test_s48_task_log_userinfo import HOST_PATH, _download

SECRET = "Mirr0rPassw0rd-s49"


async def test_a_failed_tasks_error_loses_the_urls_userinfo(env: DevEnv, sim: Any) -> None:
    upid = _download(sim, f"https://mirror:{SECRET}@{HOST_PATH}.missing", "s49-missing.iso")
    client = PveApiClient(_cluster(env))
    rt = PveApiRuntime({"default": client}, TargetResolver({"default": client}))
    try:
        with pytest.raises(TaskFailed) as failed:
            await rt._poll_task(client, upid, "pve1", 5.0, [])
    finally:
        await client.close()
    text = str(failed.value)
    assert SECRET not in text and "mirror:" not in text, text
    assert f"https://***@{HOST_PATH}.missing" in text, text
