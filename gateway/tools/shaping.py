"""Output shaping: project the declared fields, apply the policy's item limit and
redaction paths, drop fields the connector marks sensitive, and withhold one-time
secrets (`secret_output`) unless the decision's obligations reveal them."""

from __future__ import annotations

from typing import Any

from gateway.core.redaction import redact_path
from gateway.tools.tool import Tool

WITHHELD = "[withheld: the policy does not reveal this secret to this caller]"


def project(tool: Tool, data: Any) -> Any:
    fields = tool.output.get("fields")
    if not fields:
        return data
    keep = set(fields)
    if isinstance(data, dict) and isinstance(data.get("items"), list):  # a fan-out: project the rows
        return {**data, "items": project(tool, data["items"])}
    if isinstance(data, list):
        return [{k: v for k, v in row.items() if k in keep} if isinstance(row, dict) else row for row in data]
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if k in keep}
    return data


def drop_sensitive(doc: Any, names: frozenset[str]) -> Any:
    """Remove sensitive keys at any depth (connector-declared, never returned), and
    key/value rows naming one (PVE's pending-config rows are {"key": ..., "value": ...})."""
    if not names:
        return doc
    if isinstance(doc, dict):
        return {k: drop_sensitive(v, names) for k, v in doc.items() if k not in names}
    if isinstance(doc, list):
        return [drop_sensitive(v, names) for v in doc if not (isinstance(v, dict) and v.get("key") in names)]
    return doc


def shape(tool: Tool, data: Any, obligations: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The structured result the client sees, and warnings about what was cut."""
    warnings: list[str] = []
    data = drop_sensitive(project(tool, data), frozenset(tool.sensitive))
    doc: dict[str, Any] = (
        {"items": data} if isinstance(data, list) else data if isinstance(data, dict) else {"value": data}
    )
    limit = obligations.get("max_items")
    if isinstance(limit, float) and limit.is_integer():  # JSON's 5.0 is the contract's integer 5 too
        limit = int(limit)
    items = doc.get("items")
    if isinstance(items, list) and isinstance(limit, int) and not isinstance(limit, bool) and len(items) > limit:
        warnings.append(f"output limited by policy to {limit} of {len(items)} items")
        doc = {**doc, "items": items[:limit]}
    if tool.secret_output and obligations.get("reveal_secrets") is not True:  # shown once: only if policy says so
        for key in tool.secret_output:
            if key in doc:
                doc = {**doc, key: WITHHELD}
                warnings.append(f"{key} withheld by policy: Proxmox shows it only once, so it is lost to this call")
    for path in obligations.get("redact") or []:
        redact_path(doc, str(path).split("."))
    return doc, warnings
