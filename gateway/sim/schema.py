"""Read PVE's own API schema (apidata JSON) at run time and validate requests with it.

The schema is Proxmox's AGPL data, shipped beside pvegate as separate files
(`gateway/pve_schema/`); `--pve-schema DIR` or $PVEGATE_PVE_SCHEMA_DIR picks
another directory. A directory without the version's file is an error, not a
silently permissive simulator.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.pve_schema import ENV_DIR, SchemaNotFound, load_tree, schema_dir, schema_file, version_for

__all__ = ["ENV_DIR", "Endpoint", "ParamError", "Schema", "SchemaNotFound", "default_schema_dir"]

log = logging.getLogger("pvegate.sim.schema")


def default_schema_dir() -> Path:
    return schema_dir()


@dataclass
class Endpoint:
    method: str
    path: str  # template, e.g. /nodes/{node}/qemu/{vmid}
    info: dict[str, Any]
    regex: re.Pattern[str] = field(repr=False, default=re.compile(""))

    @property
    def params(self) -> dict[str, Any]:
        return dict((self.info.get("parameters") or {}).get("properties") or {})

    @property
    def permissions(self) -> dict[str, Any]:
        return dict(self.info.get("permissions") or {})


class ParamError(Exception):
    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("Parameter verification failed.")
        self.errors = errors


def _template_regex(path: str) -> re.Pattern[str]:
    parts = [("([^/]+)" if seg.startswith("{") else re.escape(seg)) for seg in path.split("/")]
    return re.compile("^" + "/".join(parts) + "$")


class Schema:
    def __init__(self, tree: list[dict[str, Any]], source: str = "") -> None:
        self.source = source
        self.by_template: dict[tuple[str, str], Endpoint] = {}
        self._by_depth: dict[int, list[Endpoint]] = {}
        self.paths: set[str] = set()
        for node in _walk(tree):
            self.paths.add(node["path"])
            for method, info in (node.get("info") or {}).items():
                ep = Endpoint(method=method, path=node["path"], info=info, regex=_template_regex(node["path"]))
                self.by_template[(method, node["path"])] = ep
        for ep in self.by_template.values():
            self._by_depth.setdefault(ep.path.count("/"), []).append(ep)
        # literal segments beat {param} segments, as in PVE's handler lookup
        for eps in self._by_depth.values():
            eps.sort(key=lambda e: e.path.count("{"))

    @classmethod
    def load(cls, directory: Path | None, major: int) -> Schema:
        """The schema for a PVE major version; SchemaNotFound (a clear message) when the directory lacks it."""
        path = schema_file(version_for(major), directory)
        try:
            tree = load_tree(path)
        except (OSError, ValueError) as exc:
            raise SchemaNotFound(f"cannot read PVE API schema {path}: {exc}") from exc
        return cls(tree, str(path))

    def match(self, method: str, path: str) -> tuple[Endpoint | None, dict[str, str], bool]:
        """(endpoint, path params, path_exists_with_other_method)."""
        path_known = False
        for ep in self._by_depth.get(path.count("/"), []):
            m = ep.regex.match(path)
            if not m:
                continue
            path_known = True
            if ep.method == method:
                names = re.findall(r"\{([^}]+)\}", ep.path)
                return ep, dict(zip(names, m.groups(), strict=True)), True
        return None, {}, path_known

    def has(self, method: str, template: str) -> bool:
        return (method, template) in self.by_template

    def validate(self, ep: Endpoint | None, params: dict[str, str]) -> dict[str, Any]:
        """Check params like PVE's JSONSchema.pm; return them converted to Python types."""
        if ep is None:
            return dict(params)
        props = ep.params
        additional = (ep.info.get("parameters") or {}).get("additionalProperties", 0)
        errors: dict[str, str] = {}
        out: dict[str, Any] = {}
        for name, raw in params.items():
            spec = props.get(name) or _indexed(props, name)
            if spec is None:
                if not additional:
                    errors[name] = (
                        "property is not defined in schema and the schema does not allow additional properties"
                    )
                else:
                    out[name] = raw
                continue
            try:
                out[name] = check_value(spec, raw, name)
            except ValueError as e:
                errors[name] = str(e)
        for name, spec in props.items():
            if "[n]" in name or spec.get("optional") or name in params:
                continue
            errors[name] = "property is missing and it is not optional"
        if errors:
            raise ParamError(errors)
        return out


def _indexed(props: dict[str, Any], name: str) -> dict[str, Any] | None:
    m = re.fullmatch(r"([a-z_-]+?)(\d+)", name)
    if m:
        return props.get(f"{m.group(1)}[n]")  # type: ignore[no-any-return]
    return None


BOOL_TRUE = {"1", "on", "yes", "true"}
BOOL_FALSE = {"0", "off", "no", "false"}
FORMATS = {
    "pve-node": r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?",
    "pve-storage-id": r"[a-z][a-z0-9\-_.]*[a-z0-9]",
    "pve-poolid": r"[A-Za-z0-9_\-]+",
    "pve-configid": r"[a-z][a-z0-9_]+",
    "pve-vmid": r"\d+",
}


def _python_regex(pattern: str) -> str:
    """Perl's serialised `(?^i:...)` (a qr// with flags) as Python's `(?i:...)`."""
    return re.sub(r"\(\?\^([a-z]*):", lambda m: f"(?{m.group(1)}:" if m.group(1) else "(?:", pattern)


def check_property_string(fmt: dict[str, Any], sval: str, path: str) -> None:
    """A property string (`virtio,bridge=vmbr0`, `enabled=1,type=isa`) checked as JSONSchema.pm's
    parse_property_string and check_object do: PVE refuses a bad one with 400, so must we."""
    res: dict[str, str] = {}
    default_key: str | None = None
    for part in sval.split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"([^=]+)=(.+)", part)
        if m:
            key, value = m.group(1), m.group(2)
            if key in res:
                raise ValueError(f"invalid format - duplicate key in comma-separated list property: {key}")
            sub = fmt.get(key)
            if sub is not None and "alias" in sub:  # virtio=MAC: model=virtio, macaddr=MAC
                if "keyAlias" in sub:
                    if sub["keyAlias"] in res:
                        raise ValueError(f"invalid format - key alias '{sub['keyAlias']}' is already defined")
                    res[sub["keyAlias"]] = key
                key = sub["alias"]
                sub = fmt.get(key)
            if sub is None:
                raise ValueError(f"invalid format - invalid key in comma-separated list property: {key}")
            res[key] = value
        elif "=" not in part:
            if default_key is not None:
                raise ValueError(f"invalid format - duplicate key in comma-separated list property: {default_key}")
            default_key = next((k for k, sub in fmt.items() if sub.get("default_key")), None)
            if default_key is None:
                raise ValueError("invalid format - value without key, but schema does not define a default key")
            if default_key in res:
                raise ValueError(f"invalid format - duplicate key in comma-separated list property: {default_key}")
            res[default_key] = part
        else:
            raise ValueError("invalid format - missing key in comma-separated list property")
    errors: dict[str, str] = {}
    for key, value in res.items():
        try:
            check_value(fmt[key], value, f"{path}.{key}")
        except ValueError as e:
            errors[f"{path}.{key}"] = str(e)
    for key, sub in fmt.items():  # check_prop: an alias or a boolean is never required
        if key not in res and not sub.get("optional") and "alias" not in sub and sub.get("type") != "boolean":
            errors[f"{path}.{key}"] = "property is missing and it is not optional"
    if errors:
        raise ValueError("invalid format - format error\n" + "\n".join(f"{k}: {v}" for k, v in sorted(errors.items())))


def check_value(spec: dict[str, Any], raw: Any, path: str = "") -> Any:
    typ = spec.get("type", "string")
    sval = str(raw)
    value: Any
    if typ == "integer":
        if not re.fullmatch(r"[+-]?\d+", sval):
            raise ValueError(f"type check ('integer') failed - got '{sval}'")
        value = int(sval)
    elif typ == "number":
        try:
            value = float(sval)
        except ValueError:
            raise ValueError(f"type check ('number') failed - got '{sval}'") from None
    elif typ == "boolean":
        low = sval.lower()
        if low in BOOL_TRUE:
            value = 1
        elif low in BOOL_FALSE:
            value = 0
        else:
            raise ValueError(f"type check ('boolean') failed - got '{sval}'")
    elif typ in ("array", "object"):
        return raw
    else:
        value = sval
        if "enum" in spec and sval not in spec["enum"]:
            raise ValueError(f"value '{sval}' does not have a value in the enumeration '{', '.join(spec['enum'])}'")
        if "pattern" in spec and not re.fullmatch(_python_regex(spec["pattern"]), sval):
            raise ValueError("value does not match the regex pattern")
        if "maxLength" in spec and len(sval) > int(spec["maxLength"]):
            raise ValueError(f"value may only be {spec['maxLength']} characters long")
        fmt = spec.get("format")
        if isinstance(fmt, dict):
            check_property_string(fmt, sval, path)
        elif isinstance(fmt, str) and fmt in FORMATS and not re.fullmatch(FORMATS[fmt], sval):
            raise ValueError(
                "value does not match the regex pattern"
                if fmt != "pve-node"
                else "invalid format - value does not look like a valid node name"
            )
    if typ in ("integer", "number"):
        if "minimum" in spec and value < spec["minimum"]:
            raise ValueError(f"value must have a minimum value of {spec['minimum']}")
        if "maximum" in spec and value > spec["maximum"]:
            raise ValueError(f"value must have a maximum value of {spec['maximum']}")
    return value


def _walk(nodes: list[dict[str, Any]]) -> Any:
    for n in nodes:
        yield n
        yield from _walk(n.get("children") or [])
