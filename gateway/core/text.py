"""Text hygiene at the edge: client text must be encodable as UTF-8.

JSON lets a client write a lone surrogate (`"\\ud800"`); Python decodes it into a
`str` that cannot be encoded again, so it would fail later, far from the
client: in the audit writer, the SQLite driver, the reply encoder. Such input
is refused where it is parsed, before anything is dispatched.

Text shown to a person (the console's pages) goes through `visible`: a bidi override or
a zero-width character in an agent's argument is shown as its escape, never obeyed.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any


def may_hold_unencodable(raw: bytes) -> bool:
    """False when a JSON body cannot decode to a lone surrogate (the cheap common case).

    A surrogate comes from a `\\u` escape, or from raw non-ASCII bytes (the json
    module decodes UTF-8 and UTF-16 bodies with `surrogatepass`).
    """
    return not raw.isascii() or b"\\u" in raw


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped(text: str) -> str:
    """A printable, always-encodable form of untrusted text (for messages and the audit)."""
    return json.dumps(text)  # ensure_ascii: a lone surrogate becomes the six characters \ud800


def unencodable_path(doc: Any) -> tuple[str | int, ...] | None:
    """Where the first string (key or value) that is not valid Unicode text sits, or None.

    Iterative, so a document as deep as the JSON parser allows cannot exhaust the stack.
    """
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), doc)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if not encodable(node):
                return path
        elif isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and not encodable(key):
                    return (*path, key)
                stack.append(((*path, key), value))
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))
    return None


# the longest a quoted piece of a client's text is in a reply, a header or the audit (a refusal quotes it:
# it must not be larger than the request that brought it)
QUOTED_MAX = 200


def cut(text: str, limit: int) -> str:
    """`text`, or its first characters and "...": never longer than `limit` (an ASCII mark: a cut text may
    end up in a header)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quoted(value: Any, limit: int = QUOTED_MAX) -> str:
    """repr() of a client's value, cut to `limit` characters: safe in a refusal, a header and the audit."""
    return cut(repr(value), limit)


def describe(path: tuple[str | int, ...]) -> str:
    """`params.arguments["\\ud800"]`-style location, escaped so it is safe to print and audit, cut to
    QUOTED_MAX characters (a path of a client's keys may be as long as its request)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and part.isascii():
            out += f".{part}" if out else part
        else:
            out += f"[{escaped(part)}]"
    return cut(out, QUOTED_MAX) or "(the document)"


# what a reader does not see as itself, or sees reorder the text around it: controls (C0 but tab, newline and
# carriage return; DEL; C1), format characters (bidi embeddings, overrides and isolates, LRM/RLM/ALM, the
# zero-width ones, U+FEFF, tag characters), lone surrogates, the line/paragraph separators, and code points
# unassigned in this Python's Unicode (a newer one may have made them format characters)
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"})
_MAYBE_HIDDEN = re.compile("[^\t\n\r\x20-\x7e]")  # the characters worth looking up


# letters and symbols that render as blank space (Hangul fillers, the braille blank): a name that looks empty
_BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _visible_char(match: re.Match[str]) -> str:
    ch = match.group()
    if unicodedata.category(ch) not in _HIDDEN_CATEGORIES and ch not in _BLANK_GLYPHS:
        return ch
    code = ord(ch)
    if code > 0xFFFF:  # as JSON writes it: a UTF-16 surrogate pair
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every character a reader would not see as itself (a bidi override, a zero-width
    space, a C1 control, a lone surrogate) written as its \\uXXXX escape, so what is shown is what is
    there. In JSON text (they occur only inside its strings) the escapes keep it valid JSON of the same value."""
    if text.isprintable() and _BLANK_GLYPHS.isdisjoint(text):  # the common case: two scans in C
        return text
    return _MAYBE_HIDDEN.sub(_visible_char, text)


# Characters that would break a line or its display: controls (a newline forging a line, an ANSI escape
# rewriting the terminal), C1, line/paragraph separators, bidi overrides and isolates.
UNSAFE_IN_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
MAX_MESSAGE = 8192  # characters of one record's message in the text log, after escaping


def _escape(ch: re.Match[str]) -> str:
    c = ch.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` as one bounded line: controls escaped (\\n, \\x1b, \\u2028), cut past `limit` characters."""
    safe = UNSAFE_IN_LINE.sub(_escape, text)
    if len(safe) > limit:
        safe = f"{safe[:limit]}... [cut {len(safe) - limit} characters]"
    return safe
