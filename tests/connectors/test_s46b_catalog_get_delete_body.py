"""The catalog refuses a GET or DELETE tool that would send a request body.

pve-http-server reads parameters from the body of a POST or PUT only: a GET or DELETE with content is
answered `501 Unexpected content for method ...` before anything runs (the simulator does the same). The
PVE API runtime (request_parts) puts a tool's `body` fields in the body whatever the method, and its
`fixed` values in the body for every method but GET, so such a tool fails every call at run time; the
loader says so at load, naming the tool. A GET's `fixed` values go in its query and are fine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog, CatalogError

CONNECTORS = REPO_ROOT / "connectors"


def _tool(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (tool,) = [t for t in doc["tools"] if t["name"] == name]
    return tool


def _load(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> Catalog:
    """storage_content.yaml changed by `mutate`, with the shared parameters, as a connector directory."""
    doc = yaml.safe_load((CONNECTORS / "storage_content.yaml").read_text())
    mutate(doc)
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    return Catalog.load(tmp_path)


def _delete_with_body(d: dict[str, Any]) -> None:
    _tool(d, "storage_volume_delete")["pve_api"]["body"] = {"storage": "storage"}


def _delete_with_fixed(d: dict[str, Any]) -> None:
    _tool(d, "storage_volume_delete")["pve_api"]["fixed"] = {"delay": 5}


def _get_with_body(d: dict[str, Any]) -> None:
    _tool(d, "storage_volume_info")["pve_api"]["body"] = {"storage": "storage"}


BAD = [
    ("DELETE body", _delete_with_body, "storage_volume_delete", "DELETE"),
    ("DELETE fixed", _delete_with_fixed, "storage_volume_delete", "DELETE"),
    ("GET body", _get_with_body, "storage_volume_info", "GET"),
]


@pytest.mark.parametrize(("label", "mutate", "tool", "method"), BAD, ids=[b[0] for b in BAD])
def test_a_get_or_delete_tool_with_body_values_is_refused(
    tmp_path: Path, label: str, mutate: Callable[[dict[str, Any]], None], tool: str, method: str
) -> None:
    with pytest.raises(CatalogError) as exc:
        _load(tmp_path, mutate)
    message = str(exc.value)
    assert tool in message and method in message and "body" in message and "501" in message, message


def test_a_gets_fixed_values_go_in_its_query_and_are_accepted(tmp_path: Path) -> None:
    catalog = _load(tmp_path, lambda d: None)
    status = catalog.get("storage_transfer_status")
    assert status is not None and status.spec["method"] == "GET" and status.spec["fixed"] == {"source": "all"}


def test_no_shipped_tool_sends_a_body_on_get_or_delete() -> None:
    for tool in Catalog.load(CONNECTORS):
        if tool.connector == "pve_api" and tool.spec["method"] in ("GET", "DELETE"):
            assert not tool.spec.get("body"), tool.name
            assert tool.spec["method"] == "GET" or not tool.spec.get("fixed"), tool.name
