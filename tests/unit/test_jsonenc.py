"""Pre-encoded JSON parts are written verbatim and give the same document as encoding it whole."""

from __future__ import annotations

import json

from gateway.core.jsonenc import Encoded, dumps, holds_encoded, splice
from gateway.mcp.jsonrpc import encode


def test_splice_gives_the_document_encoded_whole() -> None:
    tools = [{"name": "vm_start", "title": "Démarrer", "n": 1}, {"name": "x\u2028y"}]
    doc = {"contract_version": 1, "kind": "list", "tools": Encoded(dumps(tools)), "principal": {"sub": "a"}}
    out = splice(doc).json
    assert json.loads(out) == {**doc, "tools": tools}
    assert out == dumps({**doc, "tools": tools})  # key order kept: the same bytes
    assert b"\n" not in out


def test_a_lone_surrogate_is_escaped_not_an_error() -> None:
    assert dumps({"k": "\ud800"}) == b'{"k":"\\ud800"}'
    assert splice({"k": "\ud800", "t": Encoded(b"[]")}).json == b'{"k":"\\ud800","t":[]}'


def test_jsonrpc_writes_an_encoded_result_part_verbatim() -> None:
    part = Encoded(b'[{"name":"a"}]')
    assert holds_encoded({"tools": part}) and not holds_encoded({"tools": []})
    out = encode({"jsonrpc": "2.0", "id": 'q"1', "result": {"tools": part, "ttlMs": 5}})
    assert json.loads(out) == {"jsonrpc": "2.0", "id": 'q"1', "result": {"tools": [{"name": "a"}], "ttlMs": 5}}
    # a result without encoded parts is encoded as before
    assert encode({"jsonrpc": "2.0", "id": 1, "result": {}}) == b'{"jsonrpc":"2.0","id":1,"result":{}}'
