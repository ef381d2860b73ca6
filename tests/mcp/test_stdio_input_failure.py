"""stdin failing under a running call (EIO on a hung-up terminal) ends input as its close does: the
call Proxmox is running still finishes and records its outcome. Found in review: the read error was
raised out of serve_stdio before the drain, so the components closed under the call and its outcome
was lost until a later run reconciled it.

Real parts: the simulator (answering vm_stop slowly), the managed OPA sidecar, the SQLite audit."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

from gateway.app import build_components
from gateway.mcp.stdio import local_principal, serve_stdio
from tests.outcomes.helpers import env_for, posts, records, request_ids

LOCAL = {"desk-agent": {"kind": "agent", "roles": ["operator"]}}
STOP_PATH = "/qemu/103/status/stop"


class FailingStdin(io.RawIOBase):
    """Gives one request, then fails once Proxmox has the call (a terminal hung up under it)."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.given = False

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise io.UnsupportedOperation  # not pollable: read in a thread, as a terminal may be

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        if not self.given:
            self.given = True
            call = {"name": "vm_stop", "arguments": {"vmid": 103}}
            return json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}).encode() + b"\n"
        deadline = time.monotonic() + 30
        while not posts(self.sim, STOP_PATH) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise OSError(5, "Input/output error")


async def test_a_stdin_error_lets_the_running_call_finish_and_record_its_outcome(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim, shutdown_grace_seconds=30, local_principals=LOCAL)
    fsim.set_faults(answer_delay_ms=2000, answer_delay_path=r"/qemu/103/status/stop$")
    c = await build_components(env.config)
    out = io.BytesIO()
    try:
        me = local_principal(env.config.local_principals["desk-agent"])
        await asyncio.wait_for(serve_stdio(c, me, FailingStdin(fsim), out), 60)  # raised OSError before
    finally:
        await c.close()
    replies = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["id"] for r in replies] == [2], replies
    assert replies[0]["result"]["isError"] is False, replies[0]
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    outcomes = [r["outcome"] for r in records(env.config.audit_path, rid) if r["kind"] == "result"]
    assert outcomes == ["ok"], outcomes
