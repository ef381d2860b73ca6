"""stdio reads one message per line, each at most max_body_bytes (as HTTP bounds a body): a line one
byte over is refused whole, from a pipe and from a regular file alike, with or without its CR."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest

from gateway.mcp.stdio import TOO_LONG, _Lines

LIMIT = 1000


async def from_pipe(data: bytes) -> list[object]:
    r, w = os.pipe()

    def feed() -> None:
        with open(w, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed)
    t.start()
    out: list[object] = []
    with open(r, "rb", buffering=0) as f:
        lines = _Lines(f, LIMIT)
        await lines.open()
        while (line := await lines.next()) is not None:
            out.append("TOO_LONG" if line == TOO_LONG else len(line))
    t.join()
    return out


async def from_file(data: bytes) -> list[object]:
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        lines = _Lines(f, LIMIT)  # type: ignore[arg-type]
        await lines.open()
        out: list[object] = []
        while (line := await lines.next()) is not None:
            out.append("TOO_LONG" if line == TOO_LONG else len(line))
        return out


@pytest.mark.parametrize("read", [from_pipe, from_file])
@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"x" * LIMIT + b"\nabc\n", [LIMIT, 3]),
        (b"x" * (LIMIT + 1) + b"\nabc\n", ["TOO_LONG", 3]),  # one byte over: refused, the next line read
        (b"x" * (LIMIT + 2) + b"\nabc\n", ["TOO_LONG", 3]),
        (b"x" * LIMIT + b"\r\nabc\n", [LIMIT, 3]),  # a CR is the line's end, not its content
        (b"abc\n" + b"y" * (LIMIT + 1), [3, "TOO_LONG"]),  # a last line without newline, over the limit
    ],
)
async def test_a_line_past_the_limit_is_refused_whole(read: object, data: bytes, want: list[object]) -> None:
    assert await read(data) == want  # type: ignore[operator]
