"""A command's output is the node's (a guest's, through pct exec) to choose: whatever it prints,
the call ends in a tool error, never an internal error or an invalid reply."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.tools.runtimes.base import ToolError
from gateway.tools.runtimes.ssh import MAX_OUTPUT_DEPTH, SshPool, parse_output


@pytest.mark.parametrize(
    "stdout",
    [
        '{"ID": ' + "1" * 5000 + "}",  # longer than Python reads an int
        "NaN",  # no JSON: passed on, the reply would be invalid for strict clients
        '{"x": [Infinity]}',
        '{"load": 1e999}',  # a double's overflow: read as inf, it was passed on as Infinity
        "[-1E400]",
        "[" * 100_000,  # nesting without end
        "[" * (MAX_OUTPUT_DEPTH + 1) + "]" * (MAX_OUTPUT_DEPTH + 1),  # parses, but breaks output shaping
    ],
)
@pytest.mark.parametrize("kind", ["json", "json_lines"])
def test_hostile_output_is_a_tool_error(stdout: str, kind: str) -> None:
    with pytest.raises(ToolError, match="not the expected JSON"):
        parse_output(kind, stdout, 0)


def test_df_figures_that_are_no_numbers_are_unknown() -> None:
    """A guest's df (through pct exec) is the guest's to print: "²" passed str.isdigit and failed int()
    as an internal error; a figure of 5,000 digits failed int() too."""
    header = "Filesystem Type 1B-blocks Used Avail Mounted on\n"
    rows = parse_output("df", header + "/dev/x ext4 1\u00b2 \u0663 " + "9" * 5000 + " /\n/dev/y xfs 10 4 6 /srv\n", 0)
    assert rows[0] == {"filesystem": "/dev/x", "type": "ext4", "total": None, "used": None,
                       "available": None, "mountpoint": "/"}  # fmt: skip
    assert rows[1]["total"] == 10 and rows[1]["available"] == 6


def test_ordinary_output_still_parses() -> None:
    deep: Any = [1]
    for _ in range(MAX_OUTPUT_DEPTH - 1):
        deep = [deep]
    assert parse_output("json", json.dumps(deep), 0) == deep
    assert parse_output("json_lines", '{"a": 1.5}\n\n{"b": null}\n', 0) == [{"a": 1.5}, {"b": None}]


class _Conn:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


def test_a_failed_connection_is_dropped_but_not_a_newer_one() -> None:
    pool = SshPool({})
    old, new = _Conn(), _Conn()
    pool._conns[("c", "n")] = old  # type: ignore[assignment]
    pool.drop("c", "n", old)  # type: ignore[arg-type]
    assert ("c", "n") not in pool._conns and old.aborted
    pool._conns[("c", "n")] = new  # type: ignore[assignment]
    pool.drop("c", "n", old)  # type: ignore[arg-type]  # a late failure of the old one
    assert pool._conns[("c", "n")] is new and not new.aborted
