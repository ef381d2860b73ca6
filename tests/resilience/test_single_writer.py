"""One gateway process per SQLite audit file: a second `pvegate serve` or `pvegate stdio` on the
same file is refused at start, before it starts OPA or reads the audit.

Before: each process, as it started, read every call open in the audit as an earlier (crashed)
run's (Reconciler.read_earlier) and settled it, so a second process started beside a running one
settled the first one's calls in flight (and reaped the OPA its pid file named). On PostgreSQL
replicas are legitimate (the `audit_replicas` heartbeats); on SQLite the gateway now holds an
exclusive lock on `<audit file>.lock` for its life. The kernel drops it with the process, so a
crashed run never blocks the next start; the operator commands do not take it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.dev.devenv import DevEnv
from tests.outcomes.helpers import REPO, Gateway, ctx, env_for, new_port, records, request_ids, verify
from tests.stdio_process import LOCAL, Stdio, rpc, running, stop_sent

REFUSED = "pvegate: cannot start: "


def _env(tmp_path: Path, sim: Any) -> DevEnv:
    return env_for(tmp_path, sim, shutdown_grace_seconds=20, local_principals=LOCAL)


def _refusal(status: int, stderr: str, audit: Path) -> str:
    """The one-line reason of a second process refused: exit 2, no traceback, the file named."""
    assert status == 2, (status, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(REFUSED), stderr[-3000:]
    assert "another pvegate process" in last and str(audit.resolve()) in last and "PostgreSQL" in last, last
    return last


def _pvegate(env: DevEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args, "--config", str(env.config_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def test_a_second_stdio_on_the_same_audit_is_refused_and_settles_nothing(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    """The first process runs a vm_stop whose answer comes 6 s late; a second starts on the same audit
    meanwhile. It exits 2 with its reason, without starting OPA (the first's keeps running) or touching
    the first's call: that call ends with the first's own `ok`, nothing `reconciled` or `interrupted`."""
    env = _env(tmp_path, fsim)
    fsim.set_faults(answer_delay_ms=6000, answer_delay_path=r"/qemu/103/status/stop$")
    first = stdio(env).start().ready()
    first_opa = first.opa_pid()
    assert first_opa is not None
    first.send(rpc(2, "tools/call", {"name": "vm_stop", "arguments": {"vmid": 103}}))
    stop_sent(fsim)  # Proxmox has the vm_stop: the call is in flight

    second = stdio(env).start()
    status, _ = second.wait(timeout=30)
    _refusal(status, second.stderr(), env.config.audit_path)
    assert first.opa_pid() == first_opa and running(first_opa), "the refused process touched the first's OPA"

    answer = first.reply(30)
    assert answer is not None and answer["id"] == 2, answer
    assert answer["result"]["_meta"]["pvegate/outcome"] == "allowed", answer
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    kinds = [(r["kind"], r["outcome"]) for r in records(env.config.audit_path, rid)]
    assert [k for k in kinds if k[0] == "result"] == [("result", "ok")], kinds
    first.signal(signal.SIGTERM)
    status, _ = first.wait()
    assert status == 0, first.stderr()[-3000:]
    first.assert_no_opa_left()
    v = verify(env)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_killed_gateway_does_not_block_the_next_start(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    """SIGKILL: no clean-up ran, the lock file is still there, but the lock died with the process. Its
    OPA, orphaned and still running, never had the lock's descriptor: the next start is not refused."""
    env = _env(tmp_path, fsim)
    first = stdio(env).start().ready()
    orphan = first.opa_pid()
    first.signal(signal.SIGKILL)
    first.wait()
    assert orphan is not None and running(orphan)  # reaped by the next start, else by the fixture
    lock = env.config.audit_path.resolve().with_name(env.config.audit_path.name + ".lock")
    assert lock.exists()
    second = stdio(env).start().ready()
    second.signal(signal.SIGTERM)
    status, _ = second.wait()
    assert status == 0, second.stderr()[-3000:]
    second.assert_no_opa_left()


def test_operator_commands_work_beside_a_running_gateway(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    """`audit verify`, `tail`, `search` read the audit while the gateway holds the lock."""
    env = _env(tmp_path, fsim)
    gw = stdio(env).start().ready()
    gw.send(rpc(2, "tools/call", {"name": "list_nodes", "arguments": {}}))
    answer = gw.reply(30)
    assert answer is not None and answer["result"]["isError"] is False, answer
    v = verify(env)
    assert v.returncode == 0, v.stdout + v.stderr
    tail = _pvegate(env, "audit", "tail", "--jsonl")
    assert tail.returncode == 0, tail.stderr
    assert any(json.loads(line).get("tool") == "list_nodes" for line in tail.stdout.splitlines()), tail.stdout
    found = _pvegate(env, "audit", "search", "--tool", "list_nodes", "--jsonl")
    assert found.returncode == 0 and found.stdout.strip(), found.stderr
    assert gw.proc is not None and gw.proc.poll() is None
    gw.signal(signal.SIGTERM)
    status, _ = gw.wait()
    assert status == 0, gw.stderr()[-3000:]


async def test_a_second_serve_on_the_same_audit_is_refused(tmp_path: Path, fsim: Any) -> None:
    """`pvegate serve` beside `pvegate serve` (another port, the same audit file); and a `pvegate stdio`
    beside it: both refused, the first serves on."""
    env = _env(tmp_path, fsim)
    first = await Gateway(env, tmp_path / "serve1.log").start().wait_up()
    try:
        env2 = new_port(env)  # the first read its configuration already
        second = Gateway(env2, tmp_path / "serve2.log").start()
        assert second.proc is not None
        try:
            status = second.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            second.kill()
            pytest.fail("a second `pvegate serve` on the same audit started")
        _refusal(status, (tmp_path / "serve2.log").read_text(), env.config.audit_path)
        third = Stdio(env2, tmp_path).start()
        try:
            status, _ = third.wait(timeout=30)
            _refusal(status, third.stderr(), env.config.audit_path)
        finally:
            third.cleanup()
        async with httpx.AsyncClient(verify=ctx(env), timeout=5) as http:
            r = await http.get(env.url.rsplit("/mcp", 1)[0] + "/livez")
            assert r.status_code == 200
    finally:
        first.stop()
