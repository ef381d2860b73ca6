"""A read whose Proxmox answer has a shape its reducer does not expect is a clear tool error.

get_node_status (node_capacity), list_nodes (nodes), list_snapshots (snapshots), list_storage
(storage) and the others reshape Proxmox's answer in a TRANSFORMS reducer. Given a string, a
number or a list where the reducer wants an object (a broken Proxmox, a proxy's page wrapped in
`data`), the reducer raised AttributeError or TypeError out of the runtime: the pipeline turned
that into an internal error (a 500 and a traceback in the log) instead of a tool error naming
what Proxmox answered.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import ToolError
from tests.connectors.test_upstream_answers import catalog, ok, runtime_call

__all__ = ["catalog"]  # the module-scoped catalog fixture


@pytest.mark.parametrize(
    ("tool", "args", "path", "data"),
    [
        ("get_node_status", {"node": "pve1"}, "/nodes/pve1/status", "pve1 is fine"),
        ("get_node_status", {"node": "pve1"}, "/nodes/pve1/status", [{"cpu": 0.1}]),
        ("list_snapshots", {"vmid": 100}, "/nodes/pve1/qemu/100/snapshot", 42),
        ("list_storage", {"node": "pve1"}, "/nodes/pve1/storage", 42),
    ],
)
async def test_an_unexpected_shape_is_a_tool_error(
    tool: str, args: dict[str, Any], path: str, data: Any, tmp_path: Path, catalog: Catalog
) -> None:
    def handler(method: str, p: str, headers: dict[str, str]) -> Any:
        return ok(data) if (method, p) == ("GET", path) else None

    res, up = await runtime_call(handler, tmp_path, catalog, tool, args)
    assert ("GET", path) in up.seen
    assert type(res) is ToolError, repr(res)
    assert "Proxmox answered" in str(res)
