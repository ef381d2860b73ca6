"""An unknown argument's name is the client's own text, and the refusal quotes it: with its line breaks,
ANSI escapes and bidi overrides as they were, while a value with a control character is refused outright.
Quoted names are now escaped like every other client text shown to a person (the reply, the audit row)."""

from __future__ import annotations

import httpx

from gateway.dev.devenv import DevEnv
from tests.adversarial.test_corpus import max_seq, rows_after
from tests.mcp.test_bounded_refusals import http, post, tool_call
from tests.support import GatewayThread

__all__ = ["http"]  # the fixture, used by name


def test_an_unknown_arguments_name_is_quoted_escaped(gateway: GatewayThread, env: DevEnv, http: httpx.Client) -> None:
    name = "x\x1b[31mred\ny\u2028z\u202e"
    before = max_seq(env.config.audit_path)
    r = post(env, http, "escape-agent", ["viewer"], tool_call("list_nodes", {name: 1}))
    assert r.status_code == 200, r.text[:300]
    text = r.json()["result"]["content"][0]["text"]
    assert text == "invalid argument x\\u001b[31mred\\ny\\u2028z\\u202e: not a parameter of this tool", text
    rows = [row for row in rows_after(env.config.audit_path, before) if row["principal"] == "escape-agent"]
    assert rows and all("\x1b" not in (row["body"] or "") for row in rows), rows
