"""A declared tool: what the catalog builds from YAML and every layer above passes along."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from gateway.core.canonical import digest_json
from gateway.core.redaction import redact_keys
from gateway.core.text import cut, one_line, visible

PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


RELEASE = re.compile(r"^([0-9]{1,3})(?:[.]([0-9]{1,3}))?")


def parse_release(text: str) -> tuple[int, ...]:
    """ "8.4.1" -> (8, 4), "9" -> (9,); ValueError when the text does not start with a release."""
    m = RELEASE.match(text.strip())
    if m is None:
        raise ValueError(f"not a Proxmox VE release: {text[:40]!r}")
    return tuple(int(g) for g in m.groups() if g is not None)


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
    # the leaves a composite calls on guests or nodes beyond its own target (every one of the cluster's)
    fans_out: tuple[str, ...] = ()
    allocates: dict[str, Any] = field(default_factory=dict)  # requested resources (create, attach, grow)
    # where the call puts a guest (clone, migration): destination field -> parameter name
    destination: dict[str, str | None] = field(default_factory=dict)
    # the config key the call writes (a new disk's scsiN, mpN): {key: "scsi", index: parameter}; target.slot
    slot: dict[str, str] = field(default_factory=dict)
    # the backup job the call changes: {id, vmids, pool, storage, keep_all, keep} -> parameter names;
    # its saved selection and retention (target.members, target.prune_removes)
    backup_job: dict[str, str] = field(default_factory=dict)
    pve_versions: dict[str, str] = field(default_factory=dict)  # {min, max}: the PVE releases it works on
    secret_output: tuple[str, ...] = ()  # output fields shown once (a token secret): only if policy reveals them
    _validator: Any = field(default=None, compare=False, repr=False)

    @property
    def task_types(self) -> tuple[str, ...]:
        """The Proxmox task types this tool's UPID may carry (pve_api `task_type`); () for a tool without a
        task. What reconciliation looks for in a node's task list when the call's UPID was never recorded."""
        declared = self.spec.get("task_type") if self.spec.get("task") else None
        if declared is None:
            return ()
        return (declared,) if isinstance(declared, str) else tuple(declared)

    @property
    def task_worker_ids(self) -> tuple[str, ...]:
        """The forms of the worker id (the UPID's id field) Proxmox gives this tool's task (pve_api
        `task_worker_id`), each a template of `{target field}` placeholders, first choice first; () for a
        tool that declares none (its task's id is the guest's vmid, or empty when the call names no guest).
        Reconciliation matches a found task's id against the first form whose fields the call has."""
        declared = self.spec.get("task_worker_id") if self.spec.get("task") else None
        if declared is None:
            return ()
        return (declared,) if isinstance(declared, str) else tuple(declared)

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
            **({"fans_out": list(self.fans_out)} if self.fans_out else {}),
            **({"allocates": True} if self.allocates else {}),
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

    def supports(self, release: tuple[int, ...]) -> bool:
        """Whether a cluster on this PVE release (major, minor) has the tool's endpoints.
        A bound names a release ("9.0") or a whole major version ("8")."""
        low, high = self.pve_versions.get("min"), self.pve_versions.get("max")
        if low is not None and release[: len(parse_release(low))] < parse_release(low):
            return False
        return high is None or release[: len(parse_release(high))] <= parse_release(high)

    def versions_text(self) -> str:
        low, high = self.pve_versions.get("min"), self.pve_versions.get("max")
        if low and high:
            return f"PVE {low} to {high}"
        return f"PVE {low} and later" if low else f"PVE {high} and earlier"

    def validate(self, arguments: Any) -> dict[str, Any]:
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ArgumentError("arguments must be an object")
        errors = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            raise ArgumentError(_describe(errors[0]))
        props = self.parameters.get("properties", {})
        for key, value in arguments.items():
            kind = props.get(key, {}).get("type")
            # JSON Schema counts 100.0 as an integer; a Proxmox id must be a JSON integer.
            if kind == "integer" and type(value) is not int:
                raise ArgumentError(f"invalid argument {_short(key, NAME_SHOWN_MAX)}: must be a JSON integer")
            # Python's `$` matches before a trailing newline: refuse control characters outright.
            if isinstance(value, str) and CONTROL.search(value):
                raise ArgumentError(
                    f"invalid argument {_short(key, NAME_SHOWN_MAX)}: control characters are not allowed"
                )
        # A declared default is filled in here, before anything else sees the arguments: the
        # policy decides on it, the approval digest covers it and the connector sends it. A size
        # the resource quotas count is never left to Proxmox's own default (connectors/provision.yaml).
        defaults = {k: copy.deepcopy(p["default"]) for k, p in props.items() if "default" in p and k not in arguments}
        return {**arguments, **defaults}

    def placeholders(self) -> set[str]:
        """Parameter names a pve_api path or an ssh argv template uses."""
        if self.connector == "pve_api":
            return set(PLACEHOLDER.findall(self.spec["path"]))
        if self.connector == "ssh":
            return {m.group(1) for a in self.spec["argv"] if (m := PLACEHOLDER.fullmatch(a))}
        return set()


# The rule a failed keyword states, in words that never quote the rejected value:
# a value that fails a pattern may be a pasted secret, and this text reaches the audit.
_RULES: dict[str, str] = {
    "type": "must be of type {v}",
    "enum": "must be one of {v}",
    "const": "must be {v}",
    "pattern": "must match the pattern {v}",
    "maxLength": "must be at most {v} characters",
    "minLength": "must be at least {v} characters",
    "maximum": "must be at most {v}",
    "minimum": "must be at least {v}",
    "exclusiveMaximum": "must be below {v}",
    "exclusiveMinimum": "must be above {v}",
    "format": "must be a valid {v}",
    "not": "is a value this argument does not accept",
    "maxItems": "must have at most {v} items",
    "minItems": "must have at least {v} items",
}


# The refusal is written to the audit and sent back before any quota or policy applies, for any
# authenticated principal: what it quotes of the client's own text (argument names) is bounded.
NAMES_SHOWN = 10  # unknown argument names listed, then "and N more"
NAME_SHOWN_MAX = 64  # characters of one argument name
MESSAGE_MAX = 1024  # characters of the whole message


def _names(keys: list[str]) -> str:
    shown = ", ".join(_short(k, NAME_SHOWN_MAX) for k in keys[:NAMES_SHOWN])
    return shown + (f" and {len(keys) - NAMES_SHOWN} more" if len(keys) > NAMES_SHOWN else "")


def _describe(e: Any) -> str:
    """`invalid argument <name>: <rule>`: names the argument and the rule, never the value.
    For unknown or missing arguments the name is the client's own key, not a value: at most
    NAMES_SHOWN of them, each cut, and the whole message at most MESSAGE_MAX characters."""
    return _short(_explain(e), MESSAGE_MAX)


def _explain(e: Any) -> str:
    where = ".".join(_short(str(p), NAME_SHOWN_MAX) for p in list(e.path)[:NAMES_SHOWN])
    if e.validator == "additionalProperties":
        declared = e.schema.get("properties", {})
        extra = sorted(str(k) for k in e.instance if k not in declared) if isinstance(e.instance, dict) else []
        return f"invalid argument {_names(extra) or 'arguments'}: not a parameter of this tool"
    if e.validator == "required":
        missing = [str(k) for k in e.validator_value if isinstance(e.instance, dict) and k not in e.instance]
        return f"invalid argument {_names(missing) or 'arguments'}: required"
    rule = _RULES.get(str(e.validator), "breaks the rule " + str(e.validator))
    return f"invalid argument {where or 'arguments'}: {_short(rule.format(v=e.validator_value))}"


def _short(message: str, limit: int = 200) -> str:
    """Cut, with what a reader would not see as itself escaped: an unknown argument's name is the client's
    own text (a line break or an ANSI escape in it must not reach a log, a page or a terminal raw)."""
    return cut(one_line(visible(message)), limit)


def arguments_digest(
    tool: str, arguments: dict[str, Any], *, dry_run: bool = False, sensitive: Iterable[str] = ()
) -> str:
    """SHA-256 over canonical JSON of the tool name and its validated arguments; a dry run
    digests differently, so an approval granted for a rehearsal never runs the real call.

    The tool's sensitive arguments (a cloud-init password) count as `[redacted]`: the digest is
    kept in the audit and the approvals, and an unsalted hash of a password is the password to
    anyone with a word list. An approver never sees such a value, so binding to it bought nothing."""
    if sensitive:
        arguments = redact_keys(arguments, frozenset(sensitive))
    doc: dict[str, Any] = {"tool": tool, "arguments": arguments}
    if dry_run:
        doc["dry_run"] = True
    return digest_json(doc)
