"""Drive the stdio server in this process: lines in through a pipe, its replies out."""

from __future__ import annotations

import io
import json
import os
import threading
from typing import Any

from gateway.components import Components
from gateway.core.principal import Principal
from gateway.mcp.stdio import serve_stdio


async def exchange(c: Components, principal: Principal, lines: list[bytes]) -> list[dict[str, Any]]:
    """Lines in through a pipe to the stdio server itself (in this process), its replies out."""
    read_end, write_end = os.pipe()

    def feed() -> None:  # in a thread: the input may be larger than the pipe's buffer
        with open(write_end, "wb") as pipe:
            pipe.write(b"".join(line + b"\n" for line in lines))

    writer = threading.Thread(target=feed)
    writer.start()
    out = io.BytesIO()
    with open(read_end, "rb", buffering=0) as stdin:
        await serve_stdio(c, principal, stdin, out)
    writer.join()
    return [json.loads(line) for line in out.getvalue().splitlines()]
