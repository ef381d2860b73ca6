"""JSON-RPC 2.0 envelopes for the MCP endpoint: parse one message, build replies.

Error codes and their HTTP statuses come from the `mcp` package (one table for
both protocol eras), so the wire answer for a fault is the spec's, not ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
from mcp_types.jsonrpc import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
    URL_ELICITATION_REQUIRED,
)
from starlette.responses import Response

from gateway.core import jsonread
from gateway.core.jsonenc import dumps, holds_encoded, splice
from gateway.core.text import cut, describe, may_hold_unencodable, unencodable_path

__all__ = [
    "HEADER_MISMATCH",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "URL_ELICITATION_REQUIRED",
    "Message",
    "RpcFault",
    "error_response",
    "parse_message",
    "result_response",
]


MESSAGE_MAX = 1024  # characters of a fault's message
# Nesting a message may have. A tool call's arguments sit three levels down (message, params,
# arguments) and every catalog tool's arguments are flat; Python's parser takes ~980 levels, and
# what walks the arguments before validation (the requestState digest) must never meet those.
MAX_DEPTH = 64


class RpcFault(Exception):
    """A protocol fault that becomes a JSON-RPC error reply."""

    def __init__(
        self,
        code: int,
        message: str,
        data: Any = None,
        id_: Any = None,
        *,
        audited: bool = False,
        http_status: int | None = None,
        retry_after: int | None = None,
    ) -> None:
        message = cut(message, MESSAGE_MAX)  # it may quote the client's text (a method name): audited and echoed
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.id = id_
        self.audited = audited  # already recorded by whoever raised it
        # over HTTP, in both protocol eras: this status (else the era's) and a Retry-After header
        self.http_status = http_status
        self.retry_after = retry_after


@dataclass(frozen=True)
class Message:
    """One parsed JSON-RPC request or notification (id is absent for notifications)."""

    method: str
    params: dict[str, Any]
    id: str | int | None
    is_notification: bool
    raw: dict[str, Any]


def _dumps(doc: dict[str, Any]) -> bytes:
    result = doc.get("result")
    if isinstance(result, dict) and holds_encoded(result):  # a pre-encoded part (tools/list): written as it is
        return splice({**doc, "result": splice(result)}).json
    # a lone surrogate is never expected (client text is checked at parse): escaped rather than fail
    return dumps(doc)


def encode(doc: dict[str, Any]) -> bytes:
    """One JSON-RPC message as compact UTF-8 JSON (no raw newline: fit for stdio framing too)."""
    return _dumps(doc)


def result_response(id_: Any, result: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(
        _dumps({"jsonrpc": "2.0", "id": id_, "result": result}), media_type="application/json", headers=headers
    )


def error_response(id_: Any, code: int, message: str, data: Any = None, status: int | None = None) -> Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return Response(
        _dumps({"jsonrpc": "2.0", "id": id_, "error": error}),
        status_code=status if status is not None else ERROR_CODE_HTTP_STATUS.get(code, 200),
        media_type="application/json",
    )


def fault_response(fault: RpcFault) -> Response:
    return error_response(fault.id, fault.code, fault.message, fault.data)


def parse_message(body: bytes) -> Message:
    """Decode a POST body (or a stdio line) into one request or notification, or raise the spec's fault."""
    try:
        # JSON text is UTF-8 without a byte order mark (RFC 8259 §8.1); json.loads(bytes) would also
        # take UTF-16/32 and a BOM. surrogatepass: an encoded lone surrogate is refused below, saying where.
        text = body.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise RpcFault(PARSE_ERROR, "Parse error: the body is not UTF-8 text") from exc
    if text.startswith("\ufeff"):
        raise RpcFault(PARSE_ERROR, "Parse error: the body starts with a byte order mark (JSON text has none)")
    try:
        doc = jsonread.loads(text, max_depth=MAX_DEPTH, unique_names=True)
    except jsonread.NotJson as exc:  # NaN, Infinity, 1e400, nesting beyond MAX_DEPTH, a name twice
        raise RpcFault(PARSE_ERROR, f"Parse error: {exc}") from exc
    except ValueError as exc:  # malformed, or an integer literal too long to convert
        raise RpcFault(PARSE_ERROR, "Parse error: the body is not valid JSON") from exc
    if isinstance(doc, list):
        raise RpcFault(INVALID_REQUEST, "Invalid Request: JSON-RPC batches are not accepted; send one message per POST")
    if not isinstance(doc, dict):
        raise RpcFault(INVALID_REQUEST, "Invalid Request: the body must be a JSON-RPC request object")
    has_id = "id" in doc
    id_ = doc.get("id")
    valid_id = isinstance(id_, (str, int)) and not isinstance(id_, bool)
    reply_id = id_ if valid_id else None
    if may_hold_unencodable(body) and (where := unencodable_path(doc)) is not None:
        # Refused here, before anything is dispatched: such a string cannot be audited or answered verbatim.
        in_params = where[0] == "params" and len(where) > 1
        code, kind = (INVALID_PARAMS, "Invalid params") if in_params else (INVALID_REQUEST, "Invalid Request")
        raise RpcFault(
            code,
            f"{kind}: {describe(where)} is not valid Unicode text (an unpaired surrogate escape?)",
            id_=None if where[0] == "id" else reply_id,
        )
    if doc.get("jsonrpc") != "2.0":
        raise RpcFault(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', id_=reply_id)
    method = doc.get("method")
    if not isinstance(method, str):
        if "result" in doc or "error" in doc:
            raise RpcFault(INVALID_REQUEST, "Invalid Request: this server sends no requests, so it takes no responses")
        raise RpcFault(INVALID_REQUEST, 'Invalid Request: "method" must be a string', id_=reply_id)
    if has_id and not valid_id:
        raise RpcFault(INVALID_REQUEST, 'Invalid Request: "id" must be a string or an integer')
    params = doc.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcFault(INVALID_PARAMS, 'Invalid params: "params" must be an object', id_=reply_id)
    return Message(method=method, params=params, id=reply_id, is_notification=not has_id, raw=doc)
