"""A declared tool: what the catalog builds from YAML and every layer above passes along."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gateway.core.canonical import digest_json

PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


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
    uses: tuple[dict[str, Any], ...] = ()  # a composite's leaf tools, as the policy sees them
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

    @cached_property
    def policy_view(self) -> dict[str, Any]:
        """The tool as the policy sees it (built once: a tool never changes; treat as read-only)."""
        return {
            "name": self.name,
            "title": self.title,
            "connector": self.connector,
            "domain": self.domain,
            "effect": self.effect,
            "tags": list(self.tags),
            "scope": self.scope,
            **({"uses": list(self.uses)} if self.uses else {}),
        }

    @cached_property
    def mcp_view(self) -> dict[str, Any]:
        """The tool as tools/list shows it (built once; treat as read-only)."""
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
            raise ArgumentError(f"invalid argument {where}: {_short(e.message)}")
        props = self.parameters.get("properties", {})
        for key, value in arguments.items():
            kind = props.get(key, {}).get("type")
            # JSON Schema counts 100.0 as an integer; a Proxmox id must be a JSON integer.
            if kind == "integer" and type(value) is not int:
                raise ArgumentError(f"invalid argument {key}: must be a JSON integer")
            # Python's `$` matches before a trailing newline: refuse control characters outright.
            if isinstance(value, str) and CONTROL.search(value):
                raise ArgumentError(f"invalid argument {key}: control characters are not allowed")
        return dict(arguments)

    def placeholders(self) -> set[str]:
        """Parameter names a pve_api path or an ssh argv template uses."""
        if self.connector == "pve_api":
            return set(PLACEHOLDER.findall(self.spec["path"]))
        if self.connector == "ssh":
            return {m.group(1) for a in self.spec["argv"] if (m := PLACEHOLDER.fullmatch(a))}
        return set()


def _short(message: str) -> str:
    return message if len(message) <= 200 else message[:200] + "…"


def arguments_digest(tool: str, arguments: dict[str, Any], *, dry_run: bool = False) -> str:
    """SHA-256 over canonical JSON of the tool name and its validated arguments; a dry run
    digests differently, so an approval granted for a rehearsal never runs the real call."""
    doc: dict[str, Any] = {"tool": tool, "arguments": arguments}
    if dry_run:
        doc["dry_run"] = True
    return digest_json(doc)
