"""The tool catalog: YAML connector files under connectors/, loaded and validated.

A tool is data. Its connector kind, effect and parameters come from YAML; the MCP
annotations are derived from the effect so they cannot disagree with what the
policy sees. The file format is gateway/schemas/connector.schema.json and is
described in docs/connectors.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from functools import cache, cached_property, lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from gateway import pve_schema
from gateway.core import usercache, yamlread
from gateway.core.jsonenc import Encoded, dumps
from gateway.tools.runtimes.reducers import COMPOSITES, TRANSFORMS
from gateway.tools.tool import PLACEHOLDER, Tool, _short, parse_release

EFFECTS = ("read", "write", "destroy", "exec")
CONNECTORS = ("pve_api", "ssh", "composite")
SCHEMA_FILE = Path(__file__).parent.parent / "schemas" / "connector.schema.json"
# Filled by the runtime from the vmid (guest locator) or a UPID, not by the caller.
DERIVED = {"type", "node"}
# Every tool can name the cluster it targets; credentials never: a call names at most a cluster.
CLUSTER_PARAM: dict[str, Any] = {
    "type": "string",
    "pattern": "^[a-z][a-z0-9-]{0,31}$",
    "maxLength": 32,
    "description": "Cluster name from the gateway configuration; defaults to the first configured cluster.",
}


class CatalogError(Exception):
    """A connector file is invalid; the gateway refuses to start with it."""


@cache
def _file_schema_text() -> str:
    return SCHEMA_FILE.read_text()


@cache
def file_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(_file_schema_text()))


def _parameters_problem(params: dict[str, Any]) -> str | None:
    """What the JSON Schema metaschema finds wrong with a tool's parameters schema, or None.

    Checked part by part: the object's own keywords, then each parameter's schema (the metaschema
    checks every `properties` member on its own, so the verdict is the same). Tools share most
    parameters (node, vmid, ...), so 1,046 parameter schemas are 286 distinct ones, each checked once
    per process: the catalog's start-up cost was mostly this check, repeated."""
    props = params.get("properties")
    if not isinstance(props, dict):
        return _schema_problem(params)
    own = {k: v for k, v in params.items() if k != "properties"}
    if (problem := _schema_problem(own)) is not None:
        return problem
    for name, sub in props.items():
        if (problem := _schema_problem({"properties": {name: sub}})) is not None:
            return f"{name}: {problem}"
    return None


def _schema_problem(schema: dict[str, Any]) -> str | None:
    try:
        key = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # not JSON (a YAML date, a non-string key): checked as it is, uncached
        return _check_schema(schema)
    return _cached_schema_problem(key)


@lru_cache(maxsize=4096)
def _cached_schema_problem(key: str) -> str | None:
    seen = usercache.digest("parameters", key)
    if seen in _checked:
        return None
    problem = _check_schema(json.loads(key))
    if problem is None:
        _checked.add(seen)
    return problem


# Connector files and parameter schemas found valid by an earlier process, by digest: the checks
# cost ~0.3 s (files against connector.schema.json) and ~0.4 s (schemas against the metaschema) of
# every start, and each verdict depends only on the text checked, the schema it was checked
# against and what checked it, named in the file's name: this code (_VERDICTS: change it with the
# checks), the jsonschema release, the formats it can check (optional packages) and the Python
# release (the metaschema's `regex` format is Python's `re`, which differs between releases).
_VERDICTS = "catalog checks 1: connector.schema.json per file, Draft 2020-12 metaschema per parameter"
_CHECKER = usercache.digest(
    _VERDICTS,
    sys.version,
    metadata.version("jsonschema"),
    *sorted(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers),
)
_checked = usercache.KeptDigests("catalog", f"valid-{_CHECKER[:32]}.txt")


def _check_schema(schema: dict[str, Any]) -> str | None:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return None


def _build_parameters(raw: dict[str, Any], shared: dict[str, Any], where: str) -> dict[str, Any]:
    """Compose the input schema from `params:` (shared names or inline schemas) plus `cluster`."""
    if "parameters" in raw:
        params = dict(raw["parameters"])
        params.setdefault("properties", {})
        params["properties"] = {**params["properties"]}
    else:
        props: dict[str, Any] = {}
        required: list[str] = []
        for name, decl in (raw.get("params") or {}).items():
            if isinstance(decl, str):
                if name not in shared:
                    raise CatalogError(f"{where}: parameter {name} is not defined in any `parameters:` block")
                schema, req = dict(shared[name]), decl == "required"
            else:
                schema = dict(decl)
                req = bool(schema.pop("required", False))
            props[name] = schema
            if req:
                required.append(name)
        params = {"type": "object", "additionalProperties": False, "properties": props}
        if required:
            params["required"] = required
    params["properties"].setdefault("cluster", dict(CLUSTER_PARAM))
    return params


# JSON Schema 2020-12's keywords: any other key in a parameter's schema is a mistake the metaschema lets
# pass (unknown keywords are annotations), e.g. a flow mapping's unquoted `description: a, e.g. b` split
# at its comma into a key `e.g. b`, which every client is then sent
SCHEMA_KEYWORDS = frozenset(
    "$schema $id $ref $anchor $dynamicRef $dynamicAnchor $defs $comment $vocabulary type enum const multipleOf "
    "maximum exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern maxItems minItems uniqueItems "
    "maxContains minContains maxProperties minProperties required dependentRequired title description default "
    "deprecated readOnly writeOnly examples format contentEncoding contentMediaType contentSchema items "
    "prefixItems contains properties patternProperties additionalProperties propertyNames dependentSchemas "
    "unevaluatedItems unevaluatedProperties allOf anyOf oneOf not if then else".split()
)


# keywords whose value is a schema, a list of schemas, or a mapping of names to schemas
_SUBSCHEMA = frozenset(
    "items contains propertyNames additionalProperties unevaluatedItems unevaluatedProperties not if then else "
    "contentSchema".split()
)
_SUBSCHEMAS = frozenset("prefixItems allOf anyOf oneOf".split())
_NAMED_SUBSCHEMAS = frozenset("properties patternProperties dependentSchemas $defs".split())


def _unknown_keywords(schema: Any) -> list[str]:
    """The keys of `schema` and of every schema inside it that are no JSON Schema keyword (an `x-` name is
    an annotation of the connector author's own, taken as such)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key not in SCHEMA_KEYWORDS and not str(key).startswith("x-"):
                found.add(str(key))
            elif key in _SUBSCHEMA:
                stack.append(value)
            elif key in _SUBSCHEMAS and isinstance(value, list):
                stack.extend(value)
            elif key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
                stack.extend(value.values())
    return sorted(found)


def _check_strict(params: dict[str, Any], where: str) -> None:
    """Nothing free-form: bounded strings, ASCII-only digit classes, closed objects, known keywords."""
    if params.get("additionalProperties", True) is not False:
        raise CatalogError(f"{where}: parameters must set additionalProperties: false")
    for name, schema in params.get("properties", {}).items():
        subs = [schema] + ([schema["items"]] if isinstance(schema.get("items"), dict) else [])
        if unknown := _unknown_keywords(schema):
            raise CatalogError(
                f"{where}: parameter {name} has keys that are no JSON Schema keyword: {', '.join(unknown)} "
                "(a description with a comma in a {...} mapping must be quoted; an annotation of your own "
                "is named x-...)"
            )
        for sub in subs:
            t = sub.get("type")
            if t == "string" and "enum" not in sub and "maxLength" not in sub:
                raise CatalogError(f"{where}: string parameter {name} needs maxLength or enum")
            if t == "array" and "maxItems" not in sub:
                raise CatalogError(f"{where}: array parameter {name} needs maxItems")
            if "\\d" in str(sub.get("pattern", "")) or "\\w" in str(sub.get("pattern", "")):
                raise CatalogError(f"{where}: parameter {name} pattern must use [0-9]/explicit classes, not \\d or \\w")
            if t == "integer" and ("minimum" not in sub or "maximum" not in sub):
                raise CatalogError(f"{where}: integer parameter {name} needs minimum and maximum")
        if "default" in schema:  # filled in and sent as if the caller had passed it: it must pass too
            default = schema["default"]
            wrong_int = schema.get("type") == "integer" and type(default) is not int
            if wrong_int or not jsonschema.Draft202012Validator(schema).is_valid(default):
                raise CatalogError(f"{where}: the default of parameter {name} does not satisfy its own schema")


def _output_schema(raw: dict[str, Any]) -> dict[str, Any]:
    """An outputSchema from the declared projection: listed fields, untyped (policy may redact)."""
    if "outputSchema" in raw:
        return dict(raw["outputSchema"])
    out = raw.get("output") or {}
    fields: dict[str, Any] = {f: {} for f in out.get("fields", [])}
    common = {"warnings": {"type": "array", "items": {"type": "string"}}, "collected_at": {"type": "string"}}
    if out.get("list"):
        item = {"type": "object", "properties": fields} if fields else {"type": "object"}
        return {"type": "object", "properties": {"items": {"type": "array", "items": item}, **common}}
    return {"type": "object", "properties": {**fields, **common}}


def _tool_from(raw: dict[str, Any], source: str, shared: dict[str, Any]) -> Tool:
    name = raw["name"]
    where = f"{source}: tool {name}"
    connector = next(k for k in CONNECTORS if k in raw)
    params = _build_parameters(raw, shared, where)
    if (problem := _parameters_problem(params)) is not None:
        raise CatalogError(f"{where}: bad parameters schema: {problem}")
    _check_strict(params, where)
    target = {"cluster": "cluster", **dict(raw.get("target", {}))}
    destination = dict(target.pop("destination", None) or {})
    slot = dict(target.pop("slot", None) or {})
    backup_job = dict(target.pop("backup_job", None) or {})
    tool = Tool(
        name=name,
        title=raw.get("title", name),
        description=" ".join(raw.get("description", "").split()),
        connector=connector,
        domain=raw.get("domain", "cluster"),
        effect=raw["effect"],
        scope=raw.get("scope", "cluster"),
        tags=tuple(raw.get("tags", [])),
        parameters=params,
        output_schema=_output_schema(raw),
        target=target,
        sensitive=tuple(raw.get("sensitive", [])),
        secret_output=tuple(raw.get("secret_output", [])),
        allocates=dict(raw.get("allocates") or {}),
        destination=destination,
        slot=slot,
        backup_job=backup_job,
        pve_versions={k: str(v) for k, v in (raw.get("pve_versions") or {}).items()},
        spec=dict(raw[connector]),
        output=dict(raw.get("output", {})),
        dry_run=(" ".join(raw["dry_run"].split()) if raw.get("dry_run") else None),
        source=source,
        _validator=jsonschema.Draft202012Validator(params, format_checker=jsonschema.FormatChecker()),
    )
    _check_placeholders(tool, where)
    _check_versions(tool, where)
    _check_secret_names(tool, where)
    return tool


def _check_secret_names(tool: Tool, where: str) -> None:
    """The names that keep a secret out of results and the audit must name something: a typo in
    them is accepted by the file schema and lets the secret through (`sensitive: [pasword]`)."""
    params = set(tool.parameters.get("properties") or {})
    fields = set(tool.output.get("fields") or [])
    for key in tool.secret_output:
        if key not in fields:
            raise CatalogError(f"{where}: secret_output {key!r} is not one of its output fields")
    for key in tool.output.get("undocumented") or []:  # a typo would exempt nothing from `pvegate check`
        if key not in fields:
            raise CatalogError(f"{where}: output.undocumented {key!r} is not one of its output fields")
    if tool.connector == "ssh":  # its output is the command's own JSON (Docker's): no schema here describes it
        return
    # Proxmox's names (the shipped schemas, or their names kept in the user cache) only for a name
    # the tool itself does not declare
    for key in (k for k in tool.sensitive if k not in params and k not in fields):
        if key not in pve_schema.field_names():
            raise CatalogError(
                f"{where}: sensitive {key!r} is neither one of its parameters or output fields nor a field "
                "Proxmox's API has (a typo would let the secret through)"
            )
    if tool.connector == "pve_api":  # type_only names a field it sends (a typo: the field goes to both types)
        sent = {*(tool.spec.get("body") or {}), *(tool.spec.get("query") or {}), *(tool.spec.get("fixed") or {})}
        for key in tool.spec.get("type_only") or {}:
            if key not in sent:
                raise CatalogError(f"{where}: type_only {key!r} is not a field it sends (body, query or fixed)")


def _check_versions(tool: Tool, where: str) -> None:
    low, high = tool.pve_versions.get("min"), tool.pve_versions.get("max")
    if tool.pve_versions and tool.connector != "pve_api":
        raise CatalogError(f"{where}: pve_versions applies to pve_api tools only")
    if low and high and parse_release(low) > parse_release(high)[: len(parse_release(low))]:
        raise CatalogError(f"{where}: pve_versions min {low} is above max {high}")


def _check_placeholders(tool: Tool, where: str) -> None:
    props = set(tool.parameters["properties"])
    locate = tool.spec.get("locate")
    # a misspelt one would be skipped at run time, and with it the guest's type and node checks
    if locate is not None and locate not in props:
        raise CatalogError(f"{where}: locate names undeclared parameter {locate}")
    for p in tool.placeholders():
        if p in props or (p in DERIVED and tool.spec.get("locate")):
            continue
        raise CatalogError(f"{where}: placeholder {{{p}}} is not a declared parameter")
    for field_name, param in tool.target.items():
        if param not in props:
            raise CatalogError(f"{where}: target {field_name} names undeclared parameter {param}")
    if tool.slot and tool.slot["index"] not in props:
        raise CatalogError(f"{where}: target.slot index names undeclared parameter {tool.slot['index']}")
    for field_name, job_param in tool.backup_job.items():
        if job_param not in props:
            raise CatalogError(f"{where}: target.backup_job {field_name} names undeclared parameter {job_param}")
    for field_name, named in tool.destination.items():
        if named is not None and named not in props:  # null: a node the HA manager picks
            raise CatalogError(f"{where}: target.destination {field_name} names undeclared parameter {named}")
    if tool.connector == "pve_api":
        schemas = tool.parameters["properties"]
        for mapping in (tool.spec.get("query") or {}, tool.spec.get("body") or {}):
            for pve_field, value in mapping.items():
                _check_field(where, pve_field, value, schemas)
        _check_no_body(tool, where)
        if tool.effect != "read" and not tool.dry_run:
            raise CatalogError(f"{where}: a mutation needs a dry_run description")
        # the task type is what a call whose UPID was lost is found by (reconcile.py): a search that took a
        # task of any type could record another call's task (a start for a stop) as this call's outcome
        if tool.spec.get("task") and not tool.spec.get("task_type"):
            raise CatalogError(
                f"{where}: a tool with `task` must declare its task_type (the UPID's type, e.g. qmstart)"
            )
        _check_task_worker_id(tool, where)
        if tool.spec.get("no_task_for") and not tool.spec.get("task"):
            raise CatalogError(f"{where}: no_task_for is for a tool with `task`")
        if tool.spec.get("task_type") and not tool.spec.get("task"):
            raise CatalogError(
                f"{where}: task_type is for a tool with `task` (Proxmox answers this one without a task)"
            )
    _check_allocates(tool, where, props)
    if tool.connector == "ssh":
        if tool.effect != "read":
            raise CatalogError(f"{where}: ssh tools are read-only in this gateway")
        if tool.spec.get("node") not in props:
            raise CatalogError(f"{where}: ssh.node must name a declared parameter")
        if tool.spec["argv"][0] == "pct" and tool.spec.get("locate") and tool.spec.get("types") != ["lxc"]:
            # `pct exec` on a VM's vmid would reach the node first and fail there
            raise CatalogError(f"{where}: a pct command on a located guest must declare types: [lxc]")
        for p in tool.placeholders():
            schema = tool.parameters["properties"][p]
            if schema.get("type") not in ("string", "integer") or (
                schema.get("type") == "string" and not schema.get("pattern") and "enum" not in schema
            ):
                raise CatalogError(f"{where}: ssh placeholder {p} must be an integer or a string with a pattern")
    if tool.connector == "composite" and tool.effect != "read":
        raise CatalogError(f"{where}: composite tools must be read-only")


def _check_no_body(tool: Tool, where: str) -> None:
    """A GET or DELETE sends no body: pve-http-server reads parameters from the body of a POST or PUT only and
    answers any other method that carries one `501 Unexpected content`, before anything runs. The runtime
    (pve_api.request_parts) puts `body` fields in the body whatever the method, and `fixed` values in a GET's
    query but every other method's body: such a tool would fail every call."""
    method = tool.spec.get("method")
    if method not in ("GET", "DELETE"):
        return
    if tool.spec.get("body"):
        raise CatalogError(
            f"{where}: a {method} sends no body (Proxmox answers 501 Unexpected content): "
            f"declare its body fields ({', '.join(sorted(tool.spec['body']))}) under `query`"
        )
    if method != "GET" and tool.spec.get("fixed"):
        raise CatalogError(
            f"{where}: `fixed` values ({', '.join(sorted(tool.spec['fixed']))}) go in a {method}'s body, which "
            "it cannot send (Proxmox answers 501 Unexpected content): a fixed value is for a GET, POST or PUT"
        )


def _check_task_worker_id(tool: Tool, where: str) -> None:
    """`task_worker_id` (reconcile.py: the id a task found in the node's task list must carry): only for a tool
    with `task`, each form's placeholders naming the tool's target fields (what the call's audit records
    hold), so every form can be filled when the call has those fields."""
    declared = tool.spec.get("task_worker_id")
    if declared is None:
        return
    if not tool.spec.get("task"):
        raise CatalogError(
            f"{where}: task_worker_id is for a tool with `task` (Proxmox answers this one without a task)"
        )
    forms = [declared] if isinstance(declared, str) else list(declared)
    for form in forms:
        for p in PLACEHOLDER.findall(form):
            if p not in tool.target:
                raise CatalogError(
                    f"{where}: task_worker_id {form!r}: {{{p}}} is not one of its target fields "
                    f"({', '.join(sorted(tool.target)) or 'none'})"
                )
        if "{" in PLACEHOLDER.sub("", form) or "}" in PLACEHOLDER.sub("", form):
            raise CatalogError(f"{where}: task_worker_id {form!r}: a brace that is not a {{target field}} placeholder")


def _check_field(where: str, pve_field: str, value: str | list[str], schemas: dict[str, Any]) -> None:
    """A body/query entry names declared parameters; templated keys and values use only
    parameters that cannot carry a PVE property-string separator (see template_value)."""
    for p in PLACEHOLDER.findall(pve_field):
        if p not in schemas or schemas[p].get("type") != "integer":
            raise CatalogError(f"{where}: field {pve_field}: {{{p}}} must name a declared integer parameter")
    if isinstance(value, str):
        if value not in schemas:
            raise CatalogError(f"{where}: {pve_field} maps undeclared parameter {value}")
        return
    for part in value:
        for p in PLACEHOLDER.findall(part):
            schema = schemas.get(p)
            if schema is None:
                raise CatalogError(f"{where}: {pve_field} template names undeclared parameter {p}")
            if schema.get("type") == "string" and not schema.get("pattern") and "enum" not in schema:
                raise CatalogError(f"{where}: {pve_field} template parameter {p} needs a pattern or enum")
            if schema.get("type") not in ("string", "integer", "boolean"):
                raise CatalogError(f"{where}: {pve_field} template parameter {p} must be a string, integer or boolean")


def _check_allocates(tool: Tool, where: str, props: set[str]) -> None:
    a = tool.allocates
    if not a:
        return
    if tool.effect == "read":
        raise CatalogError(f"{where}: a read tool allocates nothing")
    named = [a.get("copy_of"), a.get("pool"), a.get("resize_of"), a.get("copy_of_backup"), a.get("members_of")]
    named += [q.get("param") for q in _quantities(a) if isinstance(q, dict)]
    for p in named:
        if p is not None and p not in props:
            raise CatalogError(f"{where}: allocates names undeclared parameter {p}")
    schemas = tool.parameters["properties"]
    required = set(tool.parameters.get("required", []))
    if "members_of" in a:
        # guests put into a pool: the gateway sizes them from their configs, nothing else is counted
        if set(a) != {"members_of", "pool"}:
            raise CatalogError(f"{where}: allocates.members_of takes only pool beside it (the pool they are put in)")
        return
    if "copy_of_backup" in a:
        # a restore: the gateway counts the size the backup records (read on the target's node),
        # a new guest's (guests, pool) or, with resize_of, the one it replaces in place; nothing
        # the call could set beside it is counted, so nothing may be declared
        allowed = {"copy_of_backup", "resize_of"} if "resize_of" in a else {"copy_of_backup", "guests", "pool"}
        if set(a) - allowed:
            beside = ", ".join(sorted(allowed - {"copy_of_backup"}))
            raise CatalogError(f"{where}: allocates.copy_of_backup takes only {beside} beside it")
        if not tool.target.get("node"):
            raise CatalogError(f"{where}: allocates.copy_of_backup needs target.node (where the backup is read)")
        if "resize_of" in a and a["resize_of"] != tool.target.get("vmid"):
            raise CatalogError(f"{where}: allocates.resize_of must name the target's vmid parameter")
        return
    if "resize_of" in a:
        # the gateway works the guest's final size out itself (a VM's sockets, a container's
        # swap, read from its config): only the new absolute cores and memory are declared;
        # absent, a size is unchanged, so no default applies
        sizes = {k: v for k, v in a.items() if k != "resize_of"}
        plain = all(isinstance(v, dict) and set(v) == {"param"} for v in sizes.values())
        if set(sizes) - {"cores", "memory_mib"} or not plain:
            raise CatalogError(f"{where}: allocates.resize_of takes only cores and memory_mib, each a plain {{param}}")
        if a["resize_of"] != tool.target.get("vmid"):  # the pool that grows is the target guest's
            raise CatalogError(f"{where}: allocates.resize_of must name the target's vmid parameter")
        return
    for q in _quantities(a):
        if not isinstance(q, dict):
            continue
        p = q["param"]
        # what the policy counts must be what Proxmox gets: an omitted size is never left to
        # Proxmox's default (a container without `cores` may use every core of its node)
        if "default" in schemas[p]:
            if "default" in q:
                raise CatalogError(f"{where}: allocates counts {p} at its parameter default; drop default: 0")
        elif p not in required and "default" not in q:
            raise CatalogError(
                f"{where}: allocates counts optional parameter {p}, which has no default: give the parameter a "
                "default (filled in and sent), or say default: 0 if nothing is allocated without it"
            )


def _quantities(a: dict[str, Any]) -> list[Any]:
    """Every quantity of an `allocates:` block (memory_mib and disk_gib may list several, summed)."""
    out: list[Any] = []
    for k in ("cores", "sockets", "memory_mib", "disk_gib"):
        v = a.get(k)
        out += v if isinstance(v, list) else ([] if v is None else [v])
    return out


def _check_reducers(tools: Any) -> None:
    for t in tools:
        name = t.output.get("reducer")
        if name and name not in TRANSFORMS:
            raise CatalogError(f"{t.source}: tool {t.name}: unknown output reducer {name}")
        if t.connector == "composite" and t.spec["reducer"] not in COMPOSITES:
            raise CatalogError(f"{t.source}: tool {t.name}: unknown composite reducer {t.spec['reducer']}")


class Catalog:
    def __init__(self, tools: dict[str, Tool]) -> None:
        self.tools = tools

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())

    def __len__(self) -> int:
        return len(self.tools)

    @cached_property
    def policy_views(self) -> list[dict[str, Any]]:
        """Every tool as a listing's policy input shows it (built once: the catalog does not change)."""
        return [t.policy_view for t in self.tools.values()]

    @cached_property
    def encoded_policy_views(self) -> Encoded:
        """policy_views as JSON, encoded once: the bulk of every listing's policy input."""
        return Encoded(dumps(self.policy_views))

    @classmethod
    def load(cls, directory: Path) -> Catalog:
        files = sorted(directory.glob("**/*.yaml"))
        if not files:
            raise CatalogError(f"no connector files under {directory}")
        docs: list[tuple[Path, dict[str, Any]]] = []
        shared: dict[str, Any] = {}
        for path in files:
            text = path.read_text()
            try:
                doc = yamlread.load(text) or {}  # a key given twice is refused, not dropped
            except yamlread.YamlProblems as exc:
                raise CatalogError(f"{path}: {'; '.join(exc.problems)}") from None
            except yaml.YAMLError as exc:
                raise CatalogError(f"{path}: {exc}") from exc
            seen = usercache.digest("file", _file_schema_text(), text)  # the same text reads as the same document
            if seen not in _checked:
                errors = sorted(file_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))
                if errors:
                    e = errors[0]
                    at = "/".join(str(p) for p in e.absolute_path) or "(top)"
                    raise CatalogError(f"{path}: {at}: {_short(e.message)}")
                _checked.add(seen)
            for pname, schema in (doc.get("parameters") or {}).items():
                if pname in shared:
                    raise CatalogError(f"{path}: shared parameter {pname} defined twice")
                shared[pname] = schema
            docs.append((path, doc))
        tools: dict[str, Tool] = {}
        for path, doc in docs:
            for raw in doc.get("tools") or []:
                tool = _tool_from(raw, str(path), shared)
                if tool.name in tools:
                    raise CatalogError(f"{path}: duplicate tool name {tool.name}")
                tools[tool.name] = tool
        _checked.save()
        _check_reducers(tools.values())
        composites = [t for t in tools.values() if t.connector == "composite"]
        for t in composites:
            for sub in t.spec.get("uses", []):
                used = tools.get(sub)
                if used is None or used.effect != "read" or used.connector == "composite":
                    raise CatalogError(f"{t.source}: tool {t.name}: uses {sub}, which is not a read-only leaf tool")
            fans_out = tuple(t.spec.get("fans_out", []))
            if stray := sorted(set(fans_out) - set(t.spec.get("uses", []))):
                raise CatalogError(f"{t.source}: tool {t.name}: fans_out names {', '.join(stray)}, not in its uses")
            # the policy grants a composite only where it would grant every leaf it reads through, and
            # decides a leaf it calls beyond its target (fans_out) with no scope to test
            leaves = tuple(tools[sub].policy_view for sub in t.spec.get("uses", []))
            tools[t.name] = replace(t, uses=leaves, fans_out=fans_out)
        return cls(tools)
