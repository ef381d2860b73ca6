"""`pvegate stdio` with stdin and stdout one socket (socat's EXEC:, inetd, systemd Accept=yes). Found by the
review of the stalled-stdout fix: writing such a stdout through asyncio's write-pipe transport closed it at
the first request (that transport takes a readable socket for the peer closing), so no reply was ever
sent. A socket is written as before; replies follow requests, and an end of input (the client's
shutdown(SHUT_WR)) still gets every reply."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from tests.outcomes.helpers import env_for
from tests.stdio_process import INITIALIZE, LOCAL, on_a_socket, rpc


def _lines(sock: socket.socket, n: int) -> list[dict[str, Any]]:
    buf = b""
    while buf.count(b"\n") < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return [json.loads(line) for line in buf.splitlines() if line.strip()]


def test_s47_stdin_and_stdout_one_socket_get_their_replies(tmp_path: Path, fsim: Any) -> None:
    env = env_for(tmp_path, fsim, local_principals=LOCAL)
    with on_a_socket(env, tmp_path) as (proc, mine, err_path):
        mine.sendall(json.dumps(INITIALIZE).encode() + b"\n")
        (first,) = _lines(mine, 1)
        assert first["result"]["serverInfo"]["name"] == "pvegate", first
        mine.sendall(b"".join(json.dumps(rpc(i, "ping")).encode() + b"\n" for i in range(2, 6)))
        mine.shutdown(socket.SHUT_WR)  # the end of input: what was asked is still answered
        rest = _lines(mine, 4)
        assert sorted(r["id"] for r in rest) == [2, 3, 4, 5], (rest, err_path.read_text()[-2000:])
        assert proc.wait(timeout=60) == 0, err_path.read_text()[-2000:]
