"""A stdio line whose bytes are those of the reader's "over the limit" marker. Found in review: the
marker was a byte string (`b"\\x00too long"`) compared with each line read, so a client line of those
nine bytes, short and simply not JSON, was answered and audited as a message past max_body_bytes
(`-32600`, `id: null`). Now the marker is no byte string a line can be: such a line is what any line
that is not JSON is, a parse error (`-32700`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.app import build_components
from gateway.mcp.stdio import local_principal
from tests.mcp.stdio_pipe import exchange
from tests.outcomes.helpers import env_for

LOCAL = {"desk-agent": {"kind": "agent", "roles": ["operator"]}}


async def test_a_line_that_spells_the_marker_is_a_parse_error_not_an_over_long_line(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim, local_principals=LOCAL)
    c = await build_components(env.config)
    try:
        me = local_principal(env.config.local_principals["desk-agent"])
        replies = await exchange(c, me, [b"\x00too long", b'{"jsonrpc":"2.0","id":7,"method":"ping"}'])
    finally:
        await c.close()
    assert len(replies) == 2, replies  # requests run concurrently: replies in any order
    (fault,) = [r for r in replies if r["id"] is None]
    assert fault["error"]["code"] == -32700, fault
    assert "at most" not in fault["error"]["message"], fault
    assert {"jsonrpc": "2.0", "id": 7, "result": {}} in replies, replies
