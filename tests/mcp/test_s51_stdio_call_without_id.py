"""A tools/call sent over stdio without an id was dropped without a word.

Over HTTP such a message (a request method sent as a notification) is now refused 400 and audited
(test_s51_call_without_id.py). `pvegate stdio` still took it for a notification: no reply, nothing
audited, the client waiting for an answer that never came. It is now answered with a JSON-RPC error
(id null, as for any message whose id is not known) and audited as a refusal; a real notification
still gets no reply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.app import build_components
from gateway.mcp.stdio import local_principal
from tests.mcp.stdio_pipe import exchange
from tests.outcomes.helpers import env_for, rows

LOCAL = {"desk-agent": {"kind": "agent", "roles": ["operator"]}}
CALL = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "vm_stop", "arguments": {"vmid": 100}}}


async def test_a_call_without_an_id_is_answered_with_an_error_and_audited(fsim: Any, tmp_path: Path) -> None:
    env = env_for(tmp_path, fsim, local_principals=LOCAL)
    c = await build_components(env.config)
    try:
        me = local_principal(env.config.local_principals["desk-agent"])
        lines = [json.dumps(CALL).encode(), b'{"jsonrpc":"2.0","method":"notifications/initialized"}']
        replies = await exchange(c, me, lines)
    finally:
        await c.close()
    (fault,) = replies  # the notification is not answered
    assert fault["id"] is None and fault["error"]["code"] == -32600, fault
    assert 'tools/call needs an "id"' in fault["error"]["message"], fault
    refused = [r for r in rows(env.config.audit_path) if r["kind"] == "refusal"]
    assert [r["outcome"] for r in refused] == ["protocol_error"], refused
    assert not [r for r in fsim.requests_log() if r["method"] != "GET"]  # nothing ran
