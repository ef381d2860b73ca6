"""How a sensitive value is hidden, one way for all who hide one: the audit (arguments it
keeps), the approval digest (arguments it binds) and output shaping (the policy's redact paths)."""

from __future__ import annotations

from typing import Any

REDACTED = "[redacted]"


def redact_keys(doc: Any, names: frozenset[str] | set[str]) -> Any:
    """`doc` with the values of keys in `names`, at any depth, replaced by REDACTED. Every dict
    and list is a new one, so the result may be changed without touching `doc`."""
    if isinstance(doc, dict):
        return {k: (REDACTED if k in names else redact_keys(v, names)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [redact_keys(v, names) for v in doc]
    return doc


def redact_path(doc: Any, parts: list[str]) -> None:
    """Replace the value at a dot path (with `*` for any list element or key) in place."""
    if not parts or doc is None:
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        if not rest:  # a trailing `*` redacts every element (or value) itself
            if isinstance(doc, list):
                doc[:] = [REDACTED] * len(doc)
            elif isinstance(doc, dict):
                for key in doc:
                    doc[key] = REDACTED
            return
        children = doc if isinstance(doc, list) else list(doc.values()) if isinstance(doc, dict) else []
        for child in children:
            redact_path(child, rest)
        return
    if isinstance(doc, dict) and head in doc:
        if rest:
            redact_path(doc[head], rest)
        else:
            doc[head] = REDACTED
    elif isinstance(doc, list) and head.isdigit() and int(head) < len(doc):
        if rest:
            redact_path(doc[int(head)], rest)
        else:
            doc[int(head)] = REDACTED
