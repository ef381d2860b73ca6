"""Check pve_api connectors against Proxmox's own API schema (apidata JSON or apidoc.js).

The schema is data read at run time: the PVE 8.4 and 9.1 files shipped in
gateway/pve_schema/ (AGPL, kept as separate files), or a file the user points at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.pve_schema import load_tree
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.reducers import REDUCER_FIELDS, ReducerFields
from gateway.tools.tool import Tool, parse_release

GUEST_TYPES = ("qemu", "lxc")


@dataclass(frozen=True)
class Privilege:
    path: str  # ACL path template, e.g. /vms/{vmid}
    privs: tuple[str, ...]
    any_of: bool

    def __str__(self) -> str:
        joined = (" or " if self.any_of else " and ").join(self.privs)
        return f"{joined} on {self.path}"


SCHEMA_RELEASE = re.compile(r"pve-([0-9]{1,3}[.][0-9]{1,3})-apidata")


class PveSchema:
    def __init__(self, tree: list[dict[str, Any]], source: str, release: str | None = None) -> None:
        self.source = source
        # the PVE release the schema describes ("8.4"), from its file name; None: unknown
        # (a node's apidoc.js), and every tool is checked against it
        m = SCHEMA_RELEASE.search(Path(source).name)
        self.release = release or (m.group(1) if m else None)
        self.endpoints: dict[tuple[str, str], dict[str, Any]] = {}
        stack = list(tree)
        while stack:
            node = stack.pop()
            for method, info in (node.get("info") or {}).items():
                self.endpoints[(method.upper(), node["path"])] = info
            stack.extend(node.get("children") or [])

    @classmethod
    def load(cls, path: Path) -> PveSchema:
        """apidata JSON (plain or gzip) or an apidoc.js, whose JavaScript is skipped, never run."""
        return cls(load_tree(path), str(path))


def expansions(tool: Tool) -> list[tuple[str, str, str | None]]:
    """(method, concrete path template, guest type) for each form the tool can send."""
    spec = tool.spec
    path = spec["path"]
    if "{type}" not in path:
        kinds = spec.get("types") or [None]
        return [(spec["method"], path, kinds[0] if len(kinds) == 1 else None)]
    return [(spec["method"], path.replace("{type}", k), k) for k in spec.get("types") or GUEST_TYPES]


def _sent_fields(tool: Tool, kind: str | None) -> list[str]:
    """The PVE field names the tool may send; `net{index}` is PVE's indexed `net[n]`."""
    only = tool.spec.get("type_only") or {}
    fields = [*(tool.spec.get("query") or {}), *(tool.spec.get("body") or {}), *(tool.spec.get("fixed") or {})]
    return [re.sub(r"\{[a-z_][a-z0-9_]*\}$", "[n]", f) for f in fields if kind is None or only.get(f, kind) == kind]


def check_tool(tool: Tool, schema: PveSchema) -> list[str]:
    """Problems with one pve_api tool against one schema (empty list: fine)."""
    problems: list[str] = []
    for method, path, kind in expansions(tool):
        info = schema.endpoints.get((method, path))
        if info is None:
            problems.append(f"{tool.name}: {method} {path} is not in {schema.source}")
            continue
        if not info.get("allowtoken", 1):
            problems.append(f"{tool.name}: {method} {path} is not available to API tokens")
        props = (info.get("parameters") or {}).get("properties") or {}
        for f in _sent_fields(tool, kind):
            if f not in props and re.sub(r"[0-9]+$", "[n]", f) not in props:  # scsi0: PVE's scsi[n]
                problems.append(f"{tool.name}: {method} {path} has no parameter {f!r}")
        for ph in re.findall(r"\{([^}]+)\}", path):
            if ph not in props:
                problems.append(f"{tool.name}: {method} {path} has no path parameter {ph!r}")
    return problems + _output_problems(tool, schema)


def _documented(info: dict[str, Any]) -> set[str] | None:
    """The fields the schema documents for an endpoint's answer (a list's rows); None: it documents none."""
    returns = info.get("returns") or {}
    if returns.get("type") == "array" or "items" in returns:
        returns = returns.get("items") or {}
    props = returns.get("properties")
    return set(props) if isinstance(props, dict) and props else None


def _has(fields: set[str], name: str) -> bool:
    return name in fields or re.sub(r"[0-9]+$", "[n]", name) in fields  # net0: PVE's net[n]


def _output_problems(tool: Tool, schema: PveSchema) -> list[str]:
    """Output fields that can never be in the answer: in none of the fields the schema documents for
    the endpoint (any guest type's: one projection serves both), nor declared Proxmox's undocumented
    ones (output.undocumented), nor added by the runtime (fan_out, per_row, envelope) or the reducer
    (REDUCER_FIELDS). A projected field that is never there silently yields nothing (a typo)."""
    fields = tool.output.get("fields") or []
    if not fields:
        return []
    known: set[str] = set()
    for method, path, _ in expansions(tool):
        info = schema.endpoints.get((method, path))
        documented = None if info is None else _documented(info)
        if documented is None:  # an unknown endpoint (reported above) or untyped returns: nothing to check against
            return []
        known |= documented
    spec = tool.spec
    known |= set(tool.output.get("undocumented") or [])
    if spec.get("fan_out"):
        known.add("node")
    if spec.get("per_row"):
        known |= {spec["per_row"]["as"], f"{spec['per_row']['as']}_error"}
    why = ""
    if reducer := tool.output.get("reducer"):
        shaped = REDUCER_FIELDS.get(reducer, ReducerFields())
        known = set(shaped.adds) if shaped.replaces else (known - shaped.drops) | shaped.adds
        why = f", after its reducer {reducer}" + (" (which builds a new answer)" if shaped.replaces else "")
    if wrap := tool.output.get("wrap"):
        known, why = {wrap}, f"{why}, wrapped in {wrap!r}"
    known |= set(spec.get("envelope") or ())
    endpoint = f"{spec['method']} {spec['path']}"
    return [
        f"{tool.name}: output field {f!r} is not in the answer of {endpoint}{why} as {schema.source} documents it "
        "(a typo? a field Proxmox returns undocumented is declared in output.undocumented)"
        for f in fields
        if not _has(known, f)
    ]


def applies(tool: Tool, schema: PveSchema) -> bool:
    """A tool is checked against the schemas of the PVE releases it declares (all when it declares none)."""
    return schema.release is None or tool.supports(parse_release(schema.release))


def check_catalog(catalog: Catalog, schema: PveSchema) -> list[str]:
    return [p for t in catalog if t.connector == "pve_api" and applies(t, schema) for p in check_tool(t, schema)]


def unmatched_versions(catalog: Catalog, schemas: list[PveSchema]) -> list[str]:
    """Tools whose declared PVE releases no given schema describes: checked against nothing."""
    return [
        f"{t.name}: declares {t.versions_text()}, but no schema checked describes such a release "
        f"({', '.join(s.release or 'unknown' for s in schemas)})"
        for t in catalog
        if t.pve_versions and schemas and not any(applies(t, s) for s in schemas)
    ]


def _flatten(check: Any) -> list[Privilege]:
    if not isinstance(check, list) or not check:
        return []
    op = check[0]
    if op == "perm" and len(check) >= 3:
        return [Privilege(str(check[1]), tuple(check[2]), "any" in check[3:])]
    if op in ("and", "or"):
        return [p for sub in check[1:] for p in _flatten(sub)]
    # pve-access-control's own checks: on /access/groups (or a group the user is in), on
    # the user's realm, and Permissions.Modify on the ACL path being changed
    if op == "userid-group" and len(check) >= 2 and isinstance(check[1], list):
        return [Privilege("/access/groups", tuple(check[1]), len(check[1]) > 1)]
    if op == "userid-param" and len(check) >= 2 and check[1] != "self":
        return [Privilege("/access/realm/{realm}", (str(check[1]),), False)]
    if op == "perm-modify" and len(check) >= 2:
        return [Privilege(str(check[1]), ("Permissions.Modify",), False)]
    return []


def _least(p: Privilege) -> tuple[str, ...]:
    """The privileges a role needs for one check: all of an `and`; of an `any`, an audit one if offered."""
    if not p.any_of:
        return p.privs
    return (next((n for n in p.privs if n.endswith(".Audit")), p.privs[0]),)


def privileges(tool: Tool, schema: PveSchema) -> tuple[list[Privilege], list[str]]:
    """Privileges the schema's permission checks name for this tool, and free-text notes."""
    privs: list[Privilege] = []
    notes: list[str] = []
    for method, path, _ in expansions(tool):
        info = schema.endpoints.get((method, path)) or {}
        if info and info.get("permissions") is None:  # PVE's RPC environment: no permissions, root only
            note = f"{method} {path}: the schema declares no permissions, so Proxmox allows it to root@pam only"
            if note not in notes:
                notes.append(note)
        perms = info.get("permissions") or {}
        for p in _flatten(perms.get("check")):
            if p not in privs:
                privs.append(p)
        if perms.get("description"):
            note = " ".join(str(perms["description"]).split())
            if note not in notes:
                notes.append(note)
        if perms.get("user") == "all" and not perms.get("check"):
            note = f"{method} {path}: any authenticated token; results are filtered by the token's ACLs"
            if note not in notes:
                notes.append(note)
    return privs, notes


def _note_privileges(note: str) -> list[str]:
    """The privileges a permission note's first sentence names; of alternatives ("'A', 'B' or 'C'"),
    an audit one if offered (enough to read), else the first."""
    first = note.split(". ")[0]
    found = re.findall(r"'((?:VM|Datastore|Sys|SDN|User|Group|Realm|Permissions|Pool)\.[A-Za-z.]+)'", first)
    if " or " in first and len(found) > 1:
        return [next((p for p in found if p.endswith(".Audit")), found[0])]
    return found


# What the gateway reads itself to decide a call, whatever tools it serves (gateway/tools/targets.py):
# privilege -> why. Every role `pvegate tools least-privilege` prints holds them: without them the
# facts the policy decides on are missing (a guest's pool, a pool's usage) or the target unknown.
GATEWAY_READS: dict[str, str] = {
    "Pool.Audit": (
        "the gateway itself: a guest's pool (/cluster/resources drops it without Pool.Audit on "
        "/pool/<pool>) and a pool's members for its quotas (GET /pools?poolid=)"
    ),
    "VM.Audit": (
        "the gateway itself: the guest a call names (/cluster/resources lists it only with VM.Audit) "
        "and the configs a pool's usage and a resize are sized from"
    ),
}


def role_privileges(need: dict[str, list[str]]) -> list[str]:
    """The privileges of the role for `need` (least_privilege's answer): those the tools need and
    those the gateway's own reads need (GATEWAY_READS), sorted."""
    return sorted(set(need) | set(GATEWAY_READS))


def least_privilege(
    catalog: Catalog, schema: PveSchema | list[PveSchema], effects: tuple[str, ...]
) -> dict[str, list[str]]:
    """Privilege name -> tools needing it, over pve_api tools with the given effects. Each tool's
    privileges come from the last schema given that describes a release it works on."""
    schemas = schema if isinstance(schema, list) else [schema]
    need: dict[str, list[str]] = {}
    for tool in catalog:
        if tool.connector != "pve_api" or tool.effect not in effects:
            continue
        chosen = next((s for s in reversed(schemas) if applies(tool, s)), None)
        if chosen is None:
            continue
        privs, notes = privileges(tool, chosen)
        names = {n for p in privs for n in _least(p)}
        # vzdump is user:all in the schema; its description names the real privileges
        for note in notes:  # first sentence only: the rest names options the connectors never send
            names.update(_note_privileges(note))
        for n in names:
            need.setdefault(n, []).append(tool.name)
    return dict(sorted(need.items()))
