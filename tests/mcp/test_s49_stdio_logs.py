"""`pvegate stdio` logged through logging's bare default, never the gateway's formatters: `log_format: json`
was silently ignored (plain text lines), and the text log took client text as it came, so a tool name with
a newline wrote a forged line of its own into the operator's log (`INFO pvegate.calls: ...` naming another
tool and principal). `pvegate serve` has always set them up; now `pvegate stdio` does as well."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.outcomes.helpers import env_for
from tests.stdio_process import LOCAL, rpc

FORGED = "INFO pvegate.calls: tools/call vm_delete by root: ok"
LINE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_s49_stdio_logs_in_the_configured_format_one_line_each(tmp_path: Path, fsim: Any, stdio: Any, fmt: str) -> None:
    env = env_for(tmp_path, fsim, local_principals=LOCAL, log_format=fmt)
    gw = stdio(env).start().ready()
    gw.send(rpc(2, "tools/call", {"name": f"nope\n{FORGED}", "arguments": {}}))
    got = gw.reply()
    assert got is not None and got["error"]["code"] == -32602, got
    assert gw.proc is not None and gw.proc.stdin is not None
    gw.proc.stdin.close()
    status, _ = gw.wait()
    assert status == 0, gw.stderr()[-3000:]
    lines = gw.stderr().splitlines()
    assert lines
    assert not [line for line in lines if line.startswith(FORGED)], lines  # no line the client wrote
    if fmt == "json":
        docs = [json.loads(line) for line in lines]  # each line one JSON object
        (call,) = [d for d in docs if d.get("event") == "call"]
        assert call["principal"] == "desk-agent" and call["outcome"] == "unknown_tool", call
    else:
        assert all(LINE.match(line) for line in lines), lines
        (call,) = [line for line in lines if line.startswith("INFO pvegate.calls: ")]
        assert "\\n" + FORGED in call and "[request " in call, call
