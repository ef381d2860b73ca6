"""`pvegate stdio` (a real subprocess, the real OPA sidecar, the simulator) stopped while a call runs:
a stop signal (SIGTERM, SIGINT, SIGHUP) or a client that closed its end of stdout.

Found in review: SIGTERM cancelled the server at once, so a `vm_stop` Proxmox had already received
ended in the audit with only `received` and `decision allow`, no outcome; and no later run settled
it (the reconciler ran only under `pvegate serve`). SIGHUP killed the process by its default action,
its OPA sidecar (in a session of its own) left running. A reply written to a closed stdout left
"Task exception was never retrieved" tracebacks on stderr and the server reading on.

Now a stop signal ends the reading of stdin; the calls running get `shutdown_grace_seconds` to finish
(their outcome, their reply), the rest are cut off and recorded `interrupted`; then OPA and the audit
are closed. A later run settles what an earlier one left open, as `pvegate serve` does."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.outcomes.helpers import env_for, posts, records, request_ids, rows, verify
from tests.stdio_process import INITIALIZE, LOCAL, STOP_PATH, rpc, running, stop_sent, wait_until
from tests.support import free_port


def _env(tmp_path: Path, sim: Any, grace: float) -> DevEnv:
    return env_for(tmp_path, sim, shutdown_grace_seconds=grace, local_principals=LOCAL)


def _kinds(db: Path, rid: str) -> list[tuple[str, str | None]]:
    return [(r["kind"], r["outcome"]) for r in records(db, rid)]


def _clean(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-4000:]
    assert "Task exception was never retrieved" not in stderr, stderr[-4000:]
    assert "Exception ignored" not in stderr, stderr[-4000:]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_lets_the_running_call_finish_and_record_its_outcome(
    tmp_path: Path, fsim: Any, stdio: Any, sig: signal.Signals
) -> None:
    """Proxmox has the vm_stop; its answer comes 5 s later. The signal 2.5 s into the call: the call is
    let finish within the grace period (20 s), its outcome written and its reply sent; then exit."""
    env = _env(tmp_path, fsim, grace=20)
    fsim.set_faults(answer_delay_ms=5000, answer_delay_path=r"/qemu/103/status/stop$")
    gw = stdio(env).start().ready()
    gw.send(rpc(2, "tools/call", {"name": "vm_stop", "arguments": {"vmid": 103}}))
    sent = time.monotonic()
    stop_sent(fsim)
    time.sleep(max(0.0, 2.5 - (time.monotonic() - sent)))
    assert gw.proc is not None and gw.proc.poll() is None
    gw.signal(sig)
    status, took = gw.wait()
    assert status == 0, (status, gw.stderr()[-3000:])
    answer = gw.reply(5)
    assert answer is not None and answer["id"] == 2, answer
    result = answer["result"]
    assert result["isError"] is False and result["_meta"]["pvegate/outcome"] == "allowed", result
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    assert rid == result["_meta"]["pvegate/request_id"]
    kinds = _kinds(env.config.audit_path, rid)
    assert kinds[:2] == [("received", None), ("decision", "allow")] and kinds[-1] == ("result", "ok"), kinds
    assert len(posts(fsim, STOP_PATH)) == 1
    assert fsim.state()["guests"]["103"]["status"] == "stopped"
    assert took < 15, took  # the call's own time, not the grace period
    _clean(gw.stderr())
    gw.assert_no_opa_left()
    v = verify(env)
    assert v.returncode == 0, v.stdout + v.stderr


def test_a_call_past_the_grace_period_is_interrupted_then_settled_by_the_next_run(
    tmp_path: Path, fsim: Any, stdio: Any
) -> None:
    """The answer comes 12 s late, the grace period is 1 s: the call is cut off and recorded
    `interrupted` (nothing left without an outcome), the process exits in bounded time. The next
    `pvegate stdio` settles it from Proxmox (the reconciler runs there as under `pvegate serve`)."""
    env = _env(tmp_path, fsim, grace=1)
    fsim.set_faults(answer_delay_ms=12000, answer_delay_path=r"/qemu/103/status/stop$")
    first = stdio(env).start().ready()
    first.send(rpc(2, "tools/call", {"name": "vm_stop", "arguments": {"vmid": 103}}))
    stop_sent(fsim)
    time.sleep(1.0)
    first.signal(signal.SIGTERM)
    status, took = first.wait()
    assert status == 0, (status, first.stderr()[-3000:])
    assert took < 10, took  # the grace period and the cut, not the 12 s answer
    answer = first.reply(5)
    assert answer is not None and answer["id"] == 2, answer
    assert answer["result"]["_meta"]["pvegate/outcome"] == "interrupted", answer
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    kinds = _kinds(env.config.audit_path, rid)
    assert kinds[-1] == ("result", "interrupted"), kinds
    assert records(env.config.audit_path, rid)[-1]["body"]["pending_reconcile"] is True
    _clean(first.stderr())
    first.assert_no_opa_left()

    fsim.set_faults(answer_delay_ms=0, answer_delay_path=None)
    second = stdio(env).start().ready()

    def settled() -> list[dict[str, Any]]:
        return [r for r in records(env.config.audit_path, rid) if r["outcome"] == "reconciled"]

    done = wait_until(settled, 30, "the next run to settle the interrupted call")
    assert len(done) == 1 and done[0]["body"]["proxmox"] == "ok", done
    assert len(posts(fsim, STOP_PATH)) == 1  # looked up, never sent again
    assert second.proc is not None and second.proc.stdin is not None
    second.proc.stdin.close()  # end of input: the orderly way out
    status, _ = second.wait()
    assert status == 0, second.stderr()[-3000:]
    _clean(second.stderr())
    second.assert_no_opa_left()


def test_a_crashed_runs_call_is_settled_by_the_next_stdio_run(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    """SIGKILL while Proxmox runs the vm_stop: received and decision, nothing else. The next
    `pvegate stdio` reads the open call before it serves and settles it from Proxmox."""
    env = _env(tmp_path, fsim, grace=20)
    fsim.set_faults(answer_delay_ms=8000, answer_delay_path=r"/qemu/103/status/stop$")
    first = stdio(env).start().ready()
    first.send(rpc(2, "tools/call", {"name": "vm_stop", "arguments": {"vmid": 103}}))
    stop_sent(fsim)
    first.signal(signal.SIGKILL)
    first.wait()
    first.cleanup()  # its OPA, orphaned by the kill
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    assert [k for k, _ in _kinds(env.config.audit_path, rid)] == ["received", "decision"]

    fsim.set_faults(answer_delay_ms=0, answer_delay_path=None)
    second = stdio(env).start().ready()
    done = wait_until(
        lambda: [r for r in records(env.config.audit_path, rid) if r["outcome"] == "reconciled"],
        30,
        "the next run to settle the crashed run's call",
    )
    assert done[0]["body"]["proxmox"] == "ok", done
    assert len(posts(fsim, STOP_PATH)) == 1
    second.signal(signal.SIGTERM)
    status, _ = second.wait()
    assert status == 0, second.stderr()[-3000:]
    _clean(second.stderr())
    second.assert_no_opa_left()


def test_sighup_when_idle_stops_and_leaves_no_opa(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    env = _env(tmp_path, fsim, grace=5)
    gw = stdio(env).start().ready()
    assert gw.opa_pids and all(running(p) for p in gw.opa_pids)
    gw.signal(signal.SIGHUP)
    status, took = gw.wait()
    assert status == 0, (status, gw.stderr()[-3000:])
    assert took < 10, took
    _clean(gw.stderr())
    gw.assert_no_opa_left()
    assert not (env.config.state_dir / "opa.pid").exists()


def test_a_closed_stdout_ends_the_server_after_the_running_call(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    """The client closes its end of stdout (and keeps stdin open) while a vm_stop runs: the next reply
    cannot be written. pvegate stops reading, lets the vm_stop finish (its outcome is written, though
    its reply cannot be), closes OPA and the audit, and exits: no traceback on stderr."""
    env = _env(tmp_path, fsim, grace=20)
    fsim.set_faults(answer_delay_ms=3000, answer_delay_path=r"/qemu/103/status/stop$")
    gw = stdio(env).start(reader=False)
    assert gw.proc is not None and gw.proc.stdout is not None
    gw.send(INITIALIZE)
    assert json.loads(gw.proc.stdout.readline())["id"] == 1
    gw.send(rpc(2, "tools/call", {"name": "vm_stop", "arguments": {"vmid": 103}}))
    stop_sent(fsim)
    gw.opa_pid()
    gw.proc.stdout.close()  # the only read end: pvegate's writes now fail (EPIPE)
    gw.send(rpc(3, "ping"))  # its reply is the first write to fail
    status, took = gw.wait()
    assert status == 0, (status, gw.stderr()[-3000:])
    assert took < 15, took  # the vm_stop's 3 s and the close, not waiting for stdin to end
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    assert _kinds(env.config.audit_path, rid)[-1] == ("result", "ok")
    assert fsim.state()["guests"]["103"]["status"] == "stopped"
    _clean(gw.stderr())
    gw.assert_no_opa_left()
    assert rows(env.config.audit_path, "SELECT * FROM audit WHERE outcome = 'protocol_error'") == []


def test_a_second_signal_cuts_the_running_call_off_at_once(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    """As under `pvegate serve`: the first signal waits (grace 60 s), the second stops waiting. The call
    is recorded `interrupted` and answered so, and the process exits long before the grace period."""
    env = _env(tmp_path, fsim, grace=60)
    fsim.set_faults(answer_delay_ms=15000, answer_delay_path=r"/qemu/103/status/stop$")
    gw = stdio(env).start().ready()
    gw.send(rpc(2, "tools/call", {"name": "vm_stop", "arguments": {"vmid": 103}}))
    stop_sent(fsim)
    gw.signal(signal.SIGTERM)
    time.sleep(1.0)
    assert gw.proc is not None and gw.proc.poll() is None  # the first one waits for the call
    gw.signal(signal.SIGTERM)
    status, took = gw.wait()
    assert status == 0, (status, gw.stderr()[-3000:])
    assert took < 10, took
    answer = gw.reply(5)
    assert answer is not None and answer["result"]["_meta"]["pvegate/outcome"] == "interrupted", answer
    (rid,) = request_ids(env.config.audit_path, "vm_stop")
    assert _kinds(env.config.audit_path, rid)[-1] == ("result", "interrupted")
    _clean(gw.stderr())
    gw.assert_no_opa_left()


def test_a_signal_while_opa_starts_stops_the_start_up_cleanly(tmp_path: Path, stdio: Any) -> None:
    """OPA follows a bundle service that never answers: it runs, but the start waits for the bundle (up
    to 20 s). SIGTERM then ends the start-up at once: OPA stopped, one line, exit status 2."""
    from tests.config.conftest import minimal, write

    raw = minimal(tmp_path)
    raw["local_principals"] = LOCAL
    raw["opa"] = {
        "services": {"nowhere": {"url": f"http://127.0.0.1:{free_port()}"}},
        "bundles": {"policy": {"service": "nowhere", "resource": "bundle.tar.gz"}},
        "allow_unsigned": True,
    }
    state = tmp_path / raw["state_dir"]  # relative to the configuration file
    env = SimpleNamespace(config_path=write(tmp_path, raw), config=SimpleNamespace(state_dir=state))
    gw = stdio(env).start()
    wait_until(lambda: (p := gw.opa_pid()) is not None and running(p), 60, "OPA to start")
    time.sleep(0.3)  # well inside the wait for OPA to be ready
    assert gw.proc is not None and gw.proc.poll() is None
    gw.signal(signal.SIGTERM)
    status, took = gw.wait()
    stderr = gw.stderr()
    assert status == 2, (status, stderr[-3000:])
    assert stderr.strip().splitlines()[-1].startswith("pvegate: cannot start: stopped by SIGTERM during start-up"), (
        stderr[-2000:]
    )
    assert took < 10, took
    _clean(stderr)
    gw.assert_no_opa_left()
    assert not (state / "opa.pid").exists()
