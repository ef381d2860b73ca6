"""One tool call as every layer sees it: the request the transport builds and the result it sends back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.core.principal import Principal


@dataclass
class CallRequest:
    request_id: str
    principal: Principal
    tool: str
    arguments: Any
    protocol_version: str
    source_ip: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallResult:
    outcome: str  # allowed | denied | pending_approval | invalid | failed
    text: str
    structured: dict[str, Any] | None = None
    is_error: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
