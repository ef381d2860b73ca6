"""`pvegate stdio` whose client stopped reading stdout (a real subprocess, the real OPA sidecar, the
simulator). Found in review: replies were written to stdout with a blocking write from the event
loop, so once the pipe's buffer was full the whole process froze in that write: no call made
progress and a stop signal was never handled (the loop never ran its handler), so the client's
SIGTERM was ignored until it gave up and killed the process, the calls running left unrecorded.
Now a full stdout holds back only the replies (and, once `max_inflight_per_client` of them wait,
the reading of more requests: they do not pile up in memory); a stop signal is handled as always."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from tests.outcomes.helpers import env_for
from tests.stdio_process import INITIALIZE, LOCAL, rpc


def test_a_stop_signal_is_handled_while_stdout_is_full(tmp_path: Path, fsim: Any, stdio: Any) -> None:
    env = env_for(tmp_path, fsim, shutdown_grace_seconds=2, local_principals=LOCAL)
    gw = stdio(env).start(reader=False)
    assert gw.proc is not None and gw.proc.stdin is not None and gw.proc.stdout is not None
    gw.send(INITIALIZE)
    first = json.loads(gw.proc.stdout.readline())
    assert first["result"]["serverInfo"]["name"] == "pvegate", first
    gw.opa_pid()
    # 8000 requests (8 MB: past what the reader buffers, 2 x max_body_bytes) and some 300 KB of replies,
    # nobody reading them: far past a pipe's 64 KB
    pad = "x" * 1000
    lines = b"".join(json.dumps(rpc(i, "ping", {"pad": pad})).encode() + b"\n" for i in range(2, 8002))
    stdin = gw.proc.stdin
    fed = threading.Event()

    def feed() -> None:  # a thread: the server stops reading stdin too once it holds back replies
        try:
            stdin.write(lines)
            stdin.flush()
            fed.set()
        except (OSError, ValueError):
            pass

    threading.Thread(target=feed, daemon=True).start()
    time.sleep(3.0)  # the replies fill the pipe
    assert gw.proc.poll() is None
    assert not fed.is_set(), "all 8000 requests were read, their replies held in memory"
    gw.signal(signal.SIGTERM)
    status, took = gw.wait(timeout=25)
    assert took < 10, took  # the grace period (2 s) and a bounded drain, not the cut's wait
    assert status == 0, (status, gw.stderr()[-3000:])
    assert "Traceback" not in gw.stderr(), gw.stderr()[-3000:]
    gw.assert_no_opa_left()
