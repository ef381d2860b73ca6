"""Operator logs: text or one JSON object per line, each tied to the request it is about.

A call binds its request id, principal and tool into a context variable; every log
record made while handling it carries them (JSON fields, or `[request …]` in text),
so a log line, the call's audit records and OPA's decision log (input.request.id)
join on the request id. Each tools/call ends with one `pvegate.calls` line that
carries its outcome.

Nothing from a tool's arguments or results is logged here, and tracebacks stay in
the log: a client only ever sees "internal error (request <id>)".
"""

from __future__ import annotations

import contextvars
import copy
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.core.text import UNSAFE_IN_LINE as _UNSAFE
from gateway.core.text import one_line

log = logging.getLogger("pvegate")
calls_log = logging.getLogger("pvegate.calls")


@dataclass(frozen=True)
class LogContext:
    request_id: str
    principal: str | None = None
    tool: str | None = None


CONTEXT: contextvars.ContextVar[LogContext | None] = contextvars.ContextVar("pvegate_log_context", default=None)


def bind(request_id: str, principal: str | None = None, tool: str | None = None) -> None:
    """Tie the log records of the rest of this request (this task) to it."""
    CONTEXT.set(LogContext(request_id, principal, tool))


def current_request_id() -> str | None:
    ctx = CONTEXT.get()
    return ctx.request_id if ctx is not None else None


# attributes every LogRecord has: anything else on a record came from `extra=` and is a field
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


# C0, DEL and C1 controls, the Unicode line/paragraph separators and the bidi overrides: any of
# them in client text (a tool name, a path) could start a forged line or disguise this one


def _escape_json(ch: re.Match[str]) -> str:
    return f"\\u{ord(ch.group()):04x}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the request context, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = CONTEXT.get()
        if ctx is not None:
            doc["request_id"] = ctx.request_id
            if ctx.principal is not None:
                doc["principal"] = ctx.principal
            if ctx.tool is not None:
                doc["tool"] = ctx.tool
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)  # inside the object: still one line
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes C0 controls only: DEL, the C1 controls (\x85, \x9b: a terminal's CSI), U+2028,
        # U+2029 and the bidi overrides stay raw (valid JSON), yet a reader splitting lines the way
        # str.splitlines does would see a forged line start, a terminal would run a control sequence, a
        # viewer would reorder the line. They occur only inside strings (the rest of the JSON is ASCII):
        # escaped there as \uXXXX, the JSON stays valid and its values the same
        return _UNSAFE.sub(_escape_json, json.dumps(doc, default=str, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """The classic `LEVEL logger: message`, with `[request <id>]` while a request is bound.

    The message is one line, whatever client text it carries (one_line): only a traceback,
    which follows it, spans lines. The JSON formatter escapes the same characters, as JSON
    escapes (\\u001b, \\u202e) inside its strings: one line, valid JSON, the text kept.
    """

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        shown = copy.copy(record)  # other handlers format the same record: leave it as it came
        shown.message = one_line(record.message)
        return super().formatMessage(shown)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ctx = CONTEXT.get()
        if ctx is None:
            return text
        head, sep, rest = text.partition("\n")  # a traceback follows the first line
        return f"{head} [request {one_line(ctx.request_id, 200)}]{sep}{rest}"


def formatter(fmt: str) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


class ExpectedFailureLine(logging.Filter):
    """A library's warning about a failure the gateway expects and handles (asyncpg's pool retrying its
    connections while PostgreSQL is away), as one line naming the exception, not a traceback per retry:
    during an outage the log shows what happens, not dozens of identical stacks."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and record.levelno <= logging.WARNING:
            exc = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {exc}", ()
            record.exc_info, record.exc_text = None, None
        return True


# the libraries whose warnings ExpectedFailureLine folds
QUIET_TRACEBACKS = ("asyncpg.pool",)


def configure(fmt: str, level: int = logging.INFO) -> None:
    """Format every root handler as `fmt` (text | json); install one on stderr if there is none."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(formatter(fmt))
    root.setLevel(level)
    for name in QUIET_TRACEBACKS:
        quiet = logging.getLogger(name)
        if not any(isinstance(f, ExpectedFailureLine) for f in quiet.filters):
            quiet.addFilter(ExpectedFailureLine())


class ErrorBoundary:
    """Outermost ASGI layer: an exception no handler caught is logged with its traceback and the
    request id, and the client gets a JSON 500 naming only the id (pure ASGI: no task per request)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            rid = current_request_id()
            if rid is None:
                rid = uuid.uuid4().hex
                bind(rid)
            log.exception("internal error on %s %s (request %s)", scope.get("method"), scope.get("path"), rid)
            if not started:
                response = JSONResponse(
                    {"error": "internal_error", "detail": f"internal error (request {rid})", "request_id": rid},
                    status_code=500,
                    headers={"Cache-Control": "no-store"},
                )
                await response(scope, receive, send)
