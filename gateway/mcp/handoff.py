"""Approval hand-off inside the protocol: how a pending approval reaches a human.

The approvals engine (gateway/store/approvals.py) creates the pending request and
puts its id and approval-page URL into `CallResult.meta`; this module only
chooses the protocol shape the client can act on:
- 2026-07-28 with URL elicitation: an `input_required` result carrying a URL
  elicitation and an HMAC-sealed `requestState` (gateway/mcp/request_state.py);
- 2025-11-25 with URL elicitation (remembered in the session id): the
  `-32042` URL-elicitation-required error;
- anything else: the plain pending-approval tool result (isError, with the id).
"""

from __future__ import annotations

from typing import Any

from gateway.core.calls import CallResult
from gateway.core.config import Config
from gateway.mcp.wellknown import base_url

APPROVAL_ID_META = "pvegate/approval_id"  # set by the approvals engine on a pending result
APPROVAL_URL_META = "pvegate/approval_url"  # optional: where a human approves it
APPROVAL_REQUEST_META = "pvegate/approval_request"  # set by us on a verified retry (requestState → id)
INPUT_KEY = "pvegate_approval"  # our key in inputRequests / inputResponses


def approval_id(result: CallResult) -> str | None:
    value = result.meta.get(APPROVAL_ID_META)
    return value if isinstance(value, str) and value else None


def approval_url(config: Config, result: CallResult, aid: str) -> str:
    url = result.meta.get(APPROVAL_URL_META)
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return url
    return f"{base_url(config)}/admin/approvals/{aid}"


def message(result: CallResult) -> str:
    return f"A human must approve this call before it runs. {result.text}"


def url_elicitation_declared(capabilities: Any) -> bool:
    """Did the client declare URL-mode elicitation (capabilities.elicitation.url)?"""
    if not isinstance(capabilities, dict):
        return False
    elicitation = capabilities.get("elicitation")
    return isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)


def elicitation_params(config: Config, result: CallResult, aid: str, *, with_id: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"mode": "url", "message": message(result), "url": approval_url(config, result, aid)}
    if with_id:  # required at 2025-11-25, removed at 2026-07-28
        params["elicitationId"] = aid
    return params


def input_required(config: Config, result: CallResult, aid: str, request_state: str) -> dict[str, Any]:
    return {
        "resultType": "input_required",
        "inputRequests": {
            INPUT_KEY: {
                "method": "elicitation/create",
                "params": elicitation_params(config, result, aid, with_id=False),
            }
        },
        "requestState": request_state,
    }


def url_elicitation_error_data(config: Config, result: CallResult, aid: str) -> dict[str, Any]:
    return {"elicitations": [elicitation_params(config, result, aid, with_id=True)]}
