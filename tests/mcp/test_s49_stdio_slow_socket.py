"""`pvegate stdio` with stdin and stdout one socket (socat's EXEC:, inetd, systemd Accept=yes), and a client
that reads its replies later than it sends its requests. Found in review: the loop reading stdin made the
socket non-blocking, and replies went through the buffered stdout stream: once the socket's buffer was
full, one reply reached the client cut mid-line (a broken frame) and the others were dropped, silently,
the process exiting 0. Now a reply is written whole on the descriptor, a full buffer waited out."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from tests.outcomes.helpers import env_for
from tests.stdio_process import INITIALIZE, LOCAL, on_a_socket, rpc

ASKED = range(2, 12)  # ten tools/list replies: far more than a socket's buffer holds


def _read_all(sock: socket.socket) -> bytes:
    buf = b""
    while chunk := sock.recv(1 << 20):
        buf += chunk
    return buf


def test_s49_a_socket_client_slow_to_read_gets_every_reply_whole(tmp_path: Path, fsim: Any) -> None:
    env = env_for(tmp_path, fsim, local_principals=LOCAL)
    with on_a_socket(env, tmp_path) as (proc, mine, err_path):
        mine.sendall(json.dumps(INITIALIZE).encode() + b"\n")
        first = b""
        while not first.endswith(b"\n"):
            first += mine.recv(65536)
        assert json.loads(first)["result"]["serverInfo"]["name"] == "pvegate"
        mine.sendall(b"".join(json.dumps(rpc(i, "tools/list")).encode() + b"\n" for i in ASKED))
        time.sleep(3)  # not reading: the socket's buffer fills while the replies are written
        mine.shutdown(socket.SHUT_WR)
        out = _read_all(mine)
        assert proc.wait(timeout=60) == 0, err_path.read_text()[-2000:]
    assert out.endswith(b"\n"), f"the last reply is cut: {out[-200:]!r}"
    replies = [json.loads(line) for line in out.splitlines()]  # every line a whole message
    assert sorted(r["id"] for r in replies) == list(ASKED), err_path.read_text()[-2000:]
    assert all(r["result"]["tools"] for r in replies)
