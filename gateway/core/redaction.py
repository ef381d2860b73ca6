"""How a sensitive value is hidden, one way for all who hide one: the audit (arguments it
keeps), the approval digest (arguments it binds) and output shaping (the policy's redact paths)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

REDACTED = "[redacted]"

# scheme://user:password@ up to the last '@' before a space: a password may hold '/', '?' or '#'
# as written (apt takes such a source line), so the host is not where the userinfo is sure to end,
# and a quote too (RFC 3986 allows ' among userinfo's sub-delims), so neither is a quote. A quoted
# URL ('https://u:p@h/x' in a message, a repr) keeps its closing quote, past the last '@'; a text
# with an '@' after it before any space loses more than the userinfo, never less. Not the USER@HOST
# placeholder of a hint: a word, never a credential.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(?!USER@)\S*@")


def strip_userinfo(text: str) -> str:
    """`text` with the user name and password of every URL in it replaced by `***`
    ('https://u:pw@repo.example/debian' -> 'https://***@repo.example/debian'): the settings'
    error messages and Proxmox's APT sources alike."""
    return _USERINFO.sub(r"\1***@", text) if "://" in text else text


def copy_document(
    doc: Any, names: frozenset[str] | set[str] = frozenset(), leaf: Callable[[Any], Any] | None = None
) -> Any:
    """A copy of a JSON document: the values of keys in `names`, at any depth, replaced by
    REDACTED, and every other scalar passed through `leaf` when one is given. Every dict and list
    is a new one, so the result may be changed without touching `doc`.

    Without recursion (an explicit stack): a document nested as deep as the JSON parser takes
    is copied like any other, never a RecursionError."""
    if not isinstance(doc, (dict, list)):
        return doc if leaf is None else leaf(doc)
    root: dict[Any, Any] | list[Any] = {} if isinstance(doc, dict) else []
    stack: list[tuple[Any, Any]] = [(doc, root)]
    while stack:
        src, dst = stack.pop()
        items = src.items() if isinstance(src, dict) else enumerate(src)
        for key, value in items:
            if isinstance(src, dict) and key in names:
                new: Any = REDACTED
            elif isinstance(value, (dict, list)):
                new = {} if isinstance(value, dict) else []
                stack.append((value, new))
            else:
                new = value if leaf is None else leaf(value)
            if isinstance(dst, dict):
                dst[key] = new
            else:
                dst.append(new)
    return root


def redact_keys(doc: Any, names: frozenset[str] | set[str]) -> Any:
    """`doc` with the values of keys in `names`, at any depth, replaced by REDACTED: a new copy
    (`copy_document`)."""
    return copy_document(doc, names)


# A key/value row's own fields: the key names the setting, `delete` is a flag (PVE's pending rows)
ROW_KEEP = frozenset({"key", "delete"})


def redact_path(doc: Any, parts: list[str]) -> None:
    """Replace the value at a dot path (with `*` for any list element or key) in place.

    A name segment applied to a list addresses its key/value rows (PVE's pending configuration,
    `[{"key": "sshkeys", "value": ..., "pending": ...}]`) as the object they stand for: the rows
    whose `key` is that name. At the end of the path every field of such a row but `key` and
    `delete` is replaced, so `items.sshkeys` hides a pending change of `sshkeys` as
    `config.sshkeys` hides the stored one, and the change itself stays visible.

    Without recursion (a work list of (node, the path left)): as deep as the path, never more."""
    work: list[tuple[Any, list[str]]] = [(doc, parts)]
    while work:
        node, path = work.pop()
        if not path or node is None:
            continue
        head, rest = path[0], path[1:]
        if head == "*":
            if not rest:  # a trailing `*` redacts every element (or value) itself
                if isinstance(node, list):
                    node[:] = [REDACTED] * len(node)
                elif isinstance(node, dict):
                    for key in node:
                        node[key] = REDACTED
                continue
            children = node if isinstance(node, list) else list(node.values()) if isinstance(node, dict) else []
            work.extend((child, rest) for child in reversed(children))
            continue
        if isinstance(node, dict) and head in node:
            if rest:
                work.append((node[head], rest))
            else:
                node[head] = REDACTED
        elif isinstance(node, list) and head.isdigit():
            if int(head) < len(node):
                if rest:
                    work.append((node[int(head)], rest))
                else:
                    node[int(head)] = REDACTED
        elif isinstance(node, list):  # key/value rows: the rows whose key is `head`
            for row in node:
                if not isinstance(row, dict) or row.get("key") != head:
                    continue
                for field in [f for f in row if f not in ROW_KEEP]:
                    if rest:
                        work.append((row[field], rest))
                    else:
                        row[field] = REDACTED
