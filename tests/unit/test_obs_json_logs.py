"""The JSON log escapes what the text log escapes: C1 controls (a terminal's CSI \\x9b), DEL, the
Unicode line separators and the bidi overrides and isolates stay no raw character in a line, in the
message and in extra fields alike, as \\uXXXX escapes: the JSON stays valid and the text is kept."""

from __future__ import annotations

import json
import logging

from gateway.observability.logs import JsonFormatter, one_line

HOSTILE = (
    "list_nodes\u202e\x9b31mEVIL\x1b[0m\x85next\u2028\u2029\u202a\u202b\u202c\u202d"
    + "\u2066\u2067\u2068\u2069\x7f\x80\x9f"
)
# what neither log may hold raw: C0, DEL and C1 controls, U+2028/U+2029, the bidi overrides and isolates
RAW = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F))]
RAW += [chr(c) for c in range(0x2066, 0x206A)]


def test_json_log_lines_escape_bidi_and_c1_controls_in_message_and_fields() -> None:
    record = logging.LogRecord("pvegate.calls", logging.INFO, __file__, 1, "tools/call %s by %s", (HOSTILE, "a"), None)
    record.tool_asked = HOSTILE  # an extra field
    record.nested = {"path": HOSTILE, "list": [HOSTILE]}
    line = JsonFormatter().format(record)
    assert [ch for ch in RAW if ch in line] == []
    assert len(line.splitlines()) == 1
    assert "\\u202e" in line and "\\u009b" in line and "\\u2066" in line
    doc = json.loads(line)  # still valid JSON, and the values are the text that was logged
    assert doc["msg"] == f"tools/call {HOSTILE} by a"
    assert doc["tool_asked"] == HOSTILE
    assert doc["nested"] == {"path": HOSTILE, "list": [HOSTILE]}


def test_json_and_text_logs_escape_the_same_characters() -> None:
    for ch in RAW:
        record = logging.LogRecord("pvegate", logging.INFO, __file__, 1, "a%sb", (ch,), None)
        line = JsonFormatter().format(record)
        assert ch not in line, repr(ch)
        assert one_line(ch) != ch, repr(ch)  # the text log's class: the same characters
        assert json.loads(line)["msg"] == f"a{ch}b"
    plain = "node pve1 — ok ✓ ünïcode"  # printable non-ASCII stays as it is (ensure_ascii=False)
    record = logging.LogRecord("pvegate", logging.INFO, __file__, 1, plain, None, None)
    assert plain in JsonFormatter().format(record)


def test_asyncpg_pool_retries_are_one_line_each_not_a_traceback() -> None:
    """While PostgreSQL is away asyncpg's pool logs a warning with a traceback for every reconnection
    attempt: configure() folds each into one line naming the exception (seen in a replicas run)."""
    from gateway.observability.logs import TextFormatter, configure

    root = logging.getLogger()
    before = [(h, h.formatter) for h in root.handlers], root.level  # pytest's own handlers: put back after
    try:
        configure("text")
    finally:
        for handler, fmt in before[0]:
            handler.setFormatter(fmt)
        root.setLevel(before[1])
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(TextFormatter().format(record))

    keep = Keep()
    pool = logging.getLogger("asyncpg.pool")
    pool.addHandler(keep)
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)")
        except ConnectionRefusedError:
            pool.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
    finally:
        pool.removeHandler(keep)
    assert len(lines) == 1 and "Traceback" not in lines[0] and len(lines[0].splitlines()) == 1, lines
    assert "retrying: ConnectionRefusedError: [Errno 111] Connect call failed" in lines[0]
