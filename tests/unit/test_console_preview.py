"""The console's approval page previews what a held call would send. A read held for approval is
not run for it: a dry run of a read is the read itself, unaudited."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.admin.console.views import _preview
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog


class _NoRuntime:
    """Components whose connectors must not be reached."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(clusters={"default": object()})
        self.ran: list[str] = []

    def runtime(self, tool: Any) -> Any:
        self.ran.append(tool.name)
        raise AssertionError(f"the preview ran {tool.name}")


async def test_a_held_read_is_described_not_run() -> None:
    catalog = Catalog.load(REPO_ROOT / "connectors")
    read = catalog.get("get_guest_status")
    assert read is not None and read.effect == "read" and read.connector == "pve_api"
    req = SimpleNamespace(target={"cluster": "default", "node": "pve1", "vmid": 100}, arguments={"vmid": 100})
    c = _NoRuntime()
    out = await _preview(c, read, req)  # type: ignore[arg-type]
    assert c.ran == [] and out["connector"] == "pve_api" and "GET" in out["spec"]
