"""Strict JSON reading: RFC 8259 values only, and nesting bounded when asked.

Python's json takes NaN, Infinity and -Infinity, and turns 1e999 into inf. None of them is JSON:
passed on, they make a reply invalid for a strict client and an OPA input one OPA refuses. Text
from outside the gateway (a client's body, a token's payload, a Proxmox answer, a command's
output) is read with `loads`, which refuses them with a reason that never quotes the text at length.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.core.text import cut


class NotJson(ValueError):
    """Parsed as JSON by Python, but not JSON (a constant, a number out of a double's range), or
    nested deeper than the caller takes. Malformed text raises json.JSONDecodeError as ever."""


def _constant(name: str) -> Any:
    raise NotJson(f"{name} is not a JSON value")


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999 parses to inf: no more valid in a reply than Infinity
        raise NotJson(f"the number {literal[:40]} is out of range")
    return value


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) == len(pairs):
        return doc
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            break
        seen.add(name)
    raise NotJson(f"the name {json.dumps(cut(name, 43))} appears more than once in one object")  # escaped: ASCII only


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)
# RFC 8259 §4 leaves an object with a name twice to each parser (Python keeps the last copy, others the first
# or refuse it); I-JSON (RFC 7493 §2.3) forbids it. A request read one way here and another by a proxy or a
# log reader in front is refused instead.
_UNIQUE_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite, object_pairs_hook=_unique)


def _deeper_than(doc: Any, limit: int) -> bool:
    """Level by level, without recursion: a document at Python's recursion limit is no problem here."""
    level, depth = [doc] if type(doc) in (dict, list) else [], 1
    while level:
        if depth > limit:
            return True
        below: list[Any] = []
        for value in level:
            below.extend(c for c in (value.values() if type(value) is dict else value) if type(c) in (dict, list))
        level, depth = below, depth + 1
    return False


def loads(text: str, max_depth: int | None = None, unique_names: bool = False) -> Any:
    """`text` as strict JSON. NotJson for NaN/Infinity, an out-of-range number, nesting beyond
    `max_depth` (or beyond what Python's parser can recurse into), and with `unique_names` an object
    naming a member twice (a request's body, a token's claims); json.JSONDecodeError for malformed
    text; ValueError for an integer literal longer than Python converts."""
    try:
        doc = (_UNIQUE_DECODER if unique_names else _DECODER).decode(text)
    except RecursionError as exc:
        raise NotJson("nested too deeply") from exc
    # Fewer brackets than the limit cannot nest beyond it: most documents skip the walk.
    if max_depth is not None and text.count("[") + text.count("{") > max_depth and _deeper_than(doc, max_depth):
        raise NotJson(f"nested deeper than {max_depth} levels")
    return doc
