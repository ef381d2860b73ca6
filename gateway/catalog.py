"""The tool catalog: YAML connector files under connectors/, loaded and validated.

A tool is data. Its connector kind, effect and parameters come from YAML; the MCP
annotations are derived from the effect so they cannot disagree with what the
policy sees.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

EFFECTS = ("read", "write", "destroy", "exec")


class CatalogError(Exception):
    """A connector file is invalid; the gateway refuses to start with it."""


class ArgumentError(Exception):
    """A tool call's arguments do not match the tool's declared parameters."""


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    connector: str
    domain: str
    effect: str
    scope: str
    tags: tuple[str, ...]
    parameters: dict[str, Any]
    output_schema: dict[str, Any] | None
    target: dict[str, str]  # target field -> parameter name
    sensitive: tuple[str, ...]
    spec: dict[str, Any]  # the connector-specific block (pve_api:, ssh:, composite:)
    output: dict[str, Any] = field(default_factory=dict)
    dry_run: str | None = None
    source: str = ""
    _validator: Any = field(default=None, compare=False, repr=False)

    @property
    def annotations(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "readOnlyHint": self.effect == "read",
            "destructiveHint": self.effect in ("destroy", "exec"),
            "idempotentHint": self.effect == "read",
            "openWorldHint": False,
        }

    def policy_view(self) -> dict[str, Any]:
        """The tool as the policy sees it."""
        return {
            "name": self.name,
            "title": self.title,
            "connector": self.connector,
            "domain": self.domain,
            "effect": self.effect,
            "tags": list(self.tags),
            "scope": self.scope,
        }

    def mcp_view(self) -> dict[str, Any]:
        view: dict[str, Any] = {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.parameters,
            "annotations": self.annotations,
        }
        if self.output_schema is not None:
            view["outputSchema"] = self.output_schema
        return view

    def validate(self, arguments: Any) -> dict[str, Any]:
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ArgumentError("arguments must be an object")
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = ".".join(str(p) for p in e.path) or "arguments"
            raise ArgumentError(f"invalid argument {where}: {e.message}")
        return dict(arguments)


def arguments_digest(tool: str, arguments: dict[str, Any]) -> str:
    """SHA-256 over canonical JSON of the tool name and its validated arguments."""
    canonical = json.dumps({"tool": tool, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _tool_from(raw: dict[str, Any], source: str) -> Tool:
    try:
        name = raw["name"]
        effect = raw["effect"]
        connector = next(k for k in ("pve_api", "ssh", "composite") if k in raw)
    except (KeyError, StopIteration) as exc:
        raise CatalogError(f"{source}: tool needs name, effect and a connector block ({exc})") from exc
    if effect not in EFFECTS:
        raise CatalogError(f"{source}: tool {name}: effect must be one of {EFFECTS}")
    params = raw.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as exc:
        raise CatalogError(f"{source}: tool {name}: bad parameters schema: {exc.message}") from exc
    return Tool(
        name=name,
        title=raw.get("title", name),
        description=raw.get("description", "").strip(),
        connector=connector,
        domain=raw.get("domain", "cluster"),
        effect=effect,
        scope=raw.get("scope", "cluster"),
        tags=tuple(raw.get("tags", [])),
        parameters=params,
        output_schema=raw.get("outputSchema"),
        target=dict(raw.get("target", {})),
        sensitive=tuple(raw.get("sensitive", [])),
        spec=dict(raw[connector]),
        output=dict(raw.get("output", {})),
        dry_run=raw.get("dry_run"),
        source=source,
        _validator=jsonschema.Draft202012Validator(params, format_checker=jsonschema.FormatChecker()),
    )


class Catalog:
    def __init__(self, tools: dict[str, Tool]) -> None:
        self.tools = tools

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())

    def __len__(self) -> int:
        return len(self.tools)

    @classmethod
    def load(cls, directory: Path) -> Catalog:
        tools: dict[str, Tool] = {}
        files = sorted(directory.glob("**/*.yaml"))
        if not files:
            raise CatalogError(f"no connector files under {directory}")
        for path in files:
            try:
                doc = yaml.safe_load(path.read_text())
            except yaml.YAMLError as exc:
                raise CatalogError(f"{path}: {exc}") from exc
            for raw in (doc or {}).get("tools", []):
                tool = _tool_from(raw, str(path))
                if tool.name in tools:
                    raise CatalogError(f"{path}: duplicate tool name {tool.name}")
                tools[tool.name] = tool
        return cls(tools)
