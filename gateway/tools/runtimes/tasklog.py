"""task_log_tail: the last lines of a task log, read through task_log_page (which carries
the log's total line count), so no more than the asked lines are ever fetched."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.tools.runtimes.base import ToolError

Sub = Callable[[str, dict[str, Any]], Awaitable[Any]]


async def task_log_tail(sub: Sub, args: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    upid = str(args["upid"])
    lines = int(args.get("lines") or 20)
    first = await sub("task_log_page", {"upid": upid, "start": 0, "limit": 1})
    total = first.get("total") if isinstance(first, dict) else None
    if not isinstance(total, int):
        raise ToolError(f"the log of {upid} did not say how many lines it has")
    page = await sub("task_log_page", {"upid": upid, "start": max(0, total - lines), "limit": lines})
    items = page.get("items") if isinstance(page, dict) else page
    return {"upid": upid, "total": total, "lines": [r for r in items or [] if isinstance(r, dict)]}
