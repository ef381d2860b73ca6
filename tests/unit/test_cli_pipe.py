"""`pvegate tools list | head -1`: the reader closing the pipe early is not a crash."""

from __future__ import annotations

import subprocess
import sys


def test_a_closed_pipe_ends_the_listing_quietly() -> None:
    cmd = [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())", "tools", "list"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader hangs up before the listing is written, like `head -0`
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert rc == 141, (rc, err)
