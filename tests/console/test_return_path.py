"""Where sign-in returns to: a path under /admin/ on this site, nothing a browser would resolve
elsewhere (dot segments, %2e included, could climb out of /admin/ to a path such as //evil.com)."""

from __future__ import annotations

import pytest

from gateway.admin.console.views import _local_path


@pytest.mark.parametrize(
    "value",
    [
        "/admin/audit",
        "/admin/approvals?state=pending",
        "/admin/audit/12#top",
        "/admin/",
    ],
)
def test_local_paths_are_kept(value: str) -> None:
    assert _local_path(value) == value


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "https://evil.example/admin/",
        "//evil.example/admin/",
        "/admin/..//evil.example",
        "/admin/%2e%2e//evil.example",
        "/admin/%2E%2E/%2e%2e/metrics",
        "/admin/./../mcp",
        "/admin//evil.example",
        "/admin/\\evil.example",
        "/admin/\tx",
        "/metrics",
    ],
)
def test_anything_else_returns_to_the_console(value: str | None) -> None:
    assert _local_path(value) == "/admin/"
