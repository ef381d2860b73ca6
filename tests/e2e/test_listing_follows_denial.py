"""A deny that holds for a principal whatever the arguments also hides the tool from tools/list.

Live through the gateway, the real OPA and the example data: an operator who is also in the
`contractors` group is denied `get_node_network` (guard-rail deny rule selecting the group), so
neither sees it nor can call it; the denial carries its stable code to the client and the audit.
"""

from __future__ import annotations

import json

from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from tests.support import GatewayThread, audit_rows


async def test_contractor_operator_neither_sees_nor_calls_the_denied_tool(gateway: GatewayThread, env: DevEnv) -> None:
    operator = env.token("op-plain", ["operator"])
    contractor = env.token("op-contractor", ["operator"], groups=["contractors"])
    async with mcp_client(env.url, operator, env.ca_file) as client:
        assert "get_node_network" in {t.name for t in (await client.list_tools()).tools}
    async with mcp_client(env.url, contractor, env.ca_file) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "get_node_network" not in names
        assert "list_nodes" in names  # the rest of the operator's reads stay
        res = await client.call_tool("get_node_network", {"node": "pve1"})
    assert res.is_error
    text = " ".join(c.text for c in res.content if hasattr(c, "text"))
    assert "contractors may not read the nodes' network configuration" in text  # the sentence stays
    denial = res.structured_content or {}
    assert denial["codes"] == ["guardrail.deny_rule"]
    assert denial["denials"][0]["rule"] == "data.guardrails.deny_rules[contractors-no-node-network]"

    request_id = str((res.meta or {})["pvegate/request_id"])
    rows = audit_rows(env.config.audit_path, request_id)
    decision_row = next(r for r in rows if r["kind"] == "decision")
    assert decision_row["outcome"] == "deny"
    body = json.loads(decision_row["body"])
    assert body["deny_codes"] == ["guardrail.deny_rule"]
    assert body["deny"] == [r["message"] for r in body["deny_reasons"]]
