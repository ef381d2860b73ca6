"""MCP over Streamable HTTP: a lean JSON-RPC handler on Starlette.

Stateless, JSON responses only (no SSE stream, no session ids). Protocol faults
become JSON-RPC errors; tool-level outcomes (denials, invalid arguments,
pending approvals) become tool results with isError, which a model can act on.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway import __version__
from gateway.audit import AuditRecord
from gateway.auth import AuthError, Principal
from gateway.components import Components
from gateway.decisions import CONTRACT_VERSION
from gateway.pipeline import CallRequest, UnknownTool, call_tool, request_facts

log = logging.getLogger("pvegate.transport")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

SUPPORTED_VERSIONS = tuple(v for v in HANDSHAKE_PROTOCOL_VERSIONS if v >= "2025-03-26")
DEFAULT_VERSION = "2025-03-26"  # what the spec says to assume when the header is absent


def rpc_error(id_: Any, code: int, message: str, status: int = 200) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}, status_code=status)


def rpc_result(id_: Any, result: dict[str, Any]) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": id_, "result": result})


def www_authenticate(c: Components, err: AuthError) -> str:
    base = c.config.public_url or f"https://{c.config.host}:{c.config.port}"
    return (
        f'Bearer error="{err.error}", error_description="{err}", '
        f'resource_metadata="{base}/.well-known/oauth-protected-resource"'
    )


async def authenticate(c: Components, request: Request, authn: Any) -> Principal | Response:
    try:
        principal: Principal = authn.authenticate(request.headers.get("authorization"))
        return principal
    except AuthError as err:
        await c.audit.append(
            AuditRecord(
                uuid.uuid4().hex,
                "auth_failure",
                outcome=err.error,
                body={"reason": str(err), "source_ip": request.client.host if request.client else None},
            )
        )
        return JSONResponse(
            {"error": err.error, "error_description": str(err)},
            status_code=err.status,
            headers={"WWW-Authenticate": www_authenticate(c, err)},
        )


async def handle_mcp(request: Request) -> Response:
    c: Components = request.app.state.components
    if request.method != "POST":
        return Response(status_code=405, headers={"Allow": "POST"})
    principal = await authenticate(c, request, request.app.state.authenticator)
    if not isinstance(principal, Principal):
        return principal
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return rpc_error(None, INVALID_REQUEST, "Content-Type must be application/json", status=415)
    body = await request.body()
    if len(body) > c.config.max_body_bytes:
        return rpc_error(None, INVALID_REQUEST, "request body too large", status=413)
    try:
        msg = json.loads(body)
    except ValueError:
        return rpc_error(None, PARSE_ERROR, "Parse error: body is not valid JSON", status=400)
    if isinstance(msg, list):
        return rpc_error(None, INVALID_REQUEST, "JSON-RPC batches are not supported", status=400)
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
        return rpc_error(msg.get("id") if isinstance(msg, dict) else None, INVALID_REQUEST, "Invalid Request", 400)
    method: str = msg["method"]
    if "id" not in msg:  # a notification: accepted, nothing to answer
        return Response(status_code=202)
    id_ = msg["id"]
    if not isinstance(id_, (str, int)) or isinstance(id_, bool):
        return rpc_error(None, INVALID_REQUEST, "Invalid Request: id must be a string or integer", 400)
    params = msg.get("params") or {}
    if not isinstance(params, dict):
        return rpc_error(id_, INVALID_PARAMS, "params must be an object")

    if method == "initialize":
        return rpc_result(id_, initialize_result(params))
    version = request.headers.get("mcp-protocol-version", DEFAULT_VERSION)
    if version not in SUPPORTED_VERSIONS:
        return rpc_error(id_, INVALID_REQUEST, f"Unsupported protocol version: {version}", status=400)
    if method == "ping":
        return rpc_result(id_, {})
    if method == "tools/list":
        return rpc_result(id_, await list_tools(c, principal, version, request))
    if method == "tools/call":
        return await handle_call(c, principal, id_, params, version, request)
    return rpc_error(id_, METHOD_NOT_FOUND, f"Method not found: {method}")


def initialize_result(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    version = asked if asked in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[-1]
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": {"name": "pvegate", "title": "pvegate Proxmox VE gateway", "version": __version__},
        "instructions": "Every tool call is decided by the operator's policy; denials carry the reasons.",
    }


async def list_tools(c: Components, principal: Principal, version: str, request: Request) -> dict[str, Any]:
    req = CallRequest(uuid.uuid4().hex, principal, "", None, version, request.client.host if request.client else None)
    visible = await c.decisions.visible_tools(
        {
            "contract_version": CONTRACT_VERSION,
            "kind": "list",
            "principal": principal.as_input(),
            "request": request_facts(req, "tools/list"),
            "tools": [t.policy_view() for t in c.catalog],
        }
    )
    return {"tools": [t.mcp_view() for t in c.catalog if t.name in visible]}


async def handle_call(
    c: Components, principal: Principal, id_: Any, params: dict[str, Any], version: str, request: Request
) -> Response:
    name = params.get("name")
    if not isinstance(name, str):
        return rpc_error(id_, INVALID_PARAMS, "tools/call needs a tool name")
    meta = params.get("_meta") or {}
    req = CallRequest(
        request_id=uuid.uuid4().hex,
        principal=principal,
        tool=name,
        arguments=params.get("arguments"),
        protocol_version=version,
        source_ip=request.client.host if request.client else None,
        meta=meta if isinstance(meta, dict) else {},
    )
    try:
        result = await call_tool(c, req)
    except UnknownTool:
        return rpc_error(id_, INVALID_PARAMS, f"Unknown tool: {name}")
    except Exception:
        log.exception("internal error in tools/call %s (request %s)", name, req.request_id)
        return rpc_error(id_, INTERNAL_ERROR, f"internal error (request {req.request_id})")
    out: dict[str, Any] = {"content": [{"type": "text", "text": result.text}], "isError": result.is_error}
    if result.structured is not None:
        out["structuredContent"] = result.structured
    out["_meta"] = {"pvegate/request_id": req.request_id, "pvegate/outcome": result.outcome, **result.meta}
    return rpc_result(id_, out)
