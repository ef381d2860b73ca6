"""Compact JSON, with parts encoded once and written verbatim (a large answer is not re-encoded).

A tools/list answer is ~560 KB of tool definitions and its OPA input ~130 KB of catalog: both
are the same bytes at every listing, so they are encoded once (`Encoded`) and spliced into
the document around them (`splice`) instead of being serialised again per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Encoded:
    """A JSON value already encoded as compact UTF-8 JSON: written as it is."""

    json: bytes


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (no raw newline). A lone surrogate, which UTF-8 cannot carry, is escaped."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def splice(doc: dict[str, Any]) -> Encoded:
    """`doc` encoded, its `Encoded` values (top level only) written verbatim; the same JSON
    value as `dumps` of the document they were encoded from."""
    parts = [dumps(k) + b":" + (v.json if isinstance(v, Encoded) else dumps(v)) for k, v in doc.items()]
    return Encoded(b"{" + b",".join(parts) + b"}")


def holds_encoded(doc: dict[str, Any]) -> bool:
    return any(isinstance(v, Encoded) for v in doc.values())
