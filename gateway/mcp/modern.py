"""The stateless 2026-07-28 revision: per-request `_meta` envelope, routing headers, server/discover.

The validation ladder (envelope keys, `MCP-Protocol-Version` / `Mcp-Method` /
`Mcp-Name` agreement, supported version) is the `mcp` package's own pure
classifier, so our answers match the SDK's byte for byte in code and status.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mcp.shared.inbound import (
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    unsupported_protocol_version_rejection,
)
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.methods import validate_client_request
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway.mcp import handoff, methods
from gateway.mcp.jsonrpc import HEADER_MISMATCH, INVALID_PARAMS, METHOD_NOT_FOUND, Message, RpcFault
from gateway.mcp.methods import Exchange

SUPPORTED = tuple(MODERN_PROTOCOL_VERSIONS)
_TOOLS_LIST_TTL_MS = 30_000  # visibility follows policy; calls are decided afresh anyway
_DISCOVER_TTL_MS = 3_600_000


def is_modern(version_header: str | None) -> bool:
    """Era routing (as the SDK does it): any header value that is not a handshake version goes here."""
    return version_header is not None and version_header not in HANDSHAKE_PROTOCOL_VERSIONS


def _fault(rej: InboundLadderRejection, id_: Any) -> RpcFault:
    return RpcFault(rej.code, rej.message, rej.data, id_)


def check_notification(version_header: str) -> None:
    if (rej := unsupported_protocol_version_rejection(version_header, SUPPORTED)) is not None:
        raise _fault(rej, None)


def refuse_duplicated_routing_headers(msg: Message, raw: Iterable[tuple[bytes, bytes]]) -> None:
    """RpcFault (-32020) when a routing header (MCP-Protocol-Version, ...) appears more than once."""
    decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
    if (dup := find_duplicated_routing_header(decoded)) is not None:
        raise RpcFault(HEADER_MISMATCH, f"{dup} header appears more than once", id_=msg.id)


def classify(msg: Message, headers: dict[str, str] | None, raw_headers: Iterable[tuple[str, str]]) -> tuple[str, Any]:
    """Run the ladder; returns (protocol version, declared client capabilities) or raises RpcFault.
    `headers` None (stdio): no routing headers exist, so the header rung is skipped."""
    if (dup := find_duplicated_routing_header(raw_headers)) is not None:
        raise RpcFault(HEADER_MISMATCH, f"{dup} header appears more than once", id_=msg.id)
    verdict = classify_inbound_request(msg.raw, headers=headers, supported_modern_versions=SUPPORTED)
    if isinstance(verdict, InboundLadderRejection):
        raise _fault(verdict, msg.id)
    try:
        validate_client_request(msg.method, verdict.protocol_version, msg.params)
    except KeyError as exc:  # the method does not exist at this revision
        raise RpcFault(METHOD_NOT_FOUND, f"Method not found: {msg.method}", id_=msg.id) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RpcFault(INVALID_PARAMS, f"Invalid params: {where}: {first['msg']}", id_=msg.id) from exc
    return verdict.protocol_version, verdict.client_capabilities


def wants_url_elicitation(capabilities: Any) -> bool:
    return handoff.url_elicitation_declared(capabilities)


def _complete(result: dict[str, Any]) -> dict[str, Any]:
    result.setdefault("resultType", "complete")
    meta = result.setdefault("_meta", {})
    meta[SERVER_INFO_META_KEY] = methods.SERVER_INFO
    return result


def discover() -> dict[str, Any]:
    return _complete(
        {
            "supportedVersions": [*SUPPORTED, *reversed(_LEGACY_ADVERTISED)],
            "capabilities": {"tools": {"listChanged": False}},
            "instructions": methods.INSTRUCTIONS,
            "cacheScope": "public",
            "ttlMs": _DISCOVER_TTL_MS,
        }
    )


_LEGACY_ADVERTISED: tuple[str, ...] = ("2025-06-18", "2025-11-25")


async def dispatch(x: Exchange, msg: Message) -> dict[str, Any]:
    if msg.method == "server/discover":
        return discover()
    if msg.method == "tools/list":
        result = await methods.list_tools(x)
        result.update(cacheScope="private", ttlMs=_TOOLS_LIST_TTL_MS)
        return _complete(result)
    if msg.method == "tools/call":
        return _complete(await methods.call(x, msg.params))
    raise RpcFault(METHOD_NOT_FOUND, f"Method not found: {msg.method}", id_=msg.id)
