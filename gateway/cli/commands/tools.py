"""`pvegate check` and `pvegate tools list|show|least-privilege`: read the catalog as a reviewer would.

`check` validates every connector file (format, names, placeholders, strict
parameters) and every pve_api method + path against a Proxmox API schema file:
the apidata JSON, or the `apidoc.js` a node serves at /pve-docs/api-viewer/apidoc.js.
By default that is PVE 8.4 and 9.1 as shipped in gateway/pve_schema/; a check that
finds no schema fails rather than passing unchecked (`--no-pve-schema` says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.pve_schema import ENV_DIR, VERSIONS, SchemaNotFound, schema_file
from gateway.tools.catalog import Catalog, CatalogError
from gateway.tools.pveschema import (
    GATEWAY_READS,
    PveSchema,
    applies,
    check_catalog,
    expansions,
    least_privilege,
    privileges,
    role_privileges,
    unmatched_versions,
)
from gateway.tools.tool import Tool

DEFAULT_CONNECTORS = REPO_ROOT / "connectors"
ENV_FILES = "PVEGATE_PVE_SCHEMA"  # os.pathsep-separated schema files, instead of a directory


def default_schemas() -> list[Path]:
    """$PVEGATE_PVE_SCHEMA's files, else every shipped version in $PVEGATE_PVE_SCHEMA_DIR or the package.

    SchemaNotFound when a version is missing: a check against nothing must not pass.
    """
    env = os.environ.get(ENV_FILES)
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return [schema_file(v) for v in VERSIONS]


def _load(directory: Path) -> Catalog | None:
    try:
        return Catalog.load(directory)
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _schemas(paths: list[Path] | None) -> list[PveSchema] | None:
    out = []
    try:
        chosen = paths or default_schemas()
    except SchemaNotFound as exc:
        where = f" (${ENV_DIR})" if os.environ.get(ENV_DIR) else ""
        print(f"error: {exc}{where}", file=sys.stderr)
        return None
    if not chosen:
        print(f"error: ${ENV_FILES} names no schema file", file=sys.stderr)
        return None
    for p in chosen:
        try:
            out.append(PveSchema.load(p))
        except (OSError, ValueError) as exc:
            print(f"error: cannot read PVE schema {p}: {exc}", file=sys.stderr)
            return None
    return out


def _check(args: argparse.Namespace) -> int:
    catalog = _load(args.connectors)
    if catalog is None:
        return 1
    if args.no_pve_schema:
        schemas: list[PveSchema] | None = []
    else:
        schemas = _schemas(args.pve_schema)
    if schemas is None:
        print("pvegate check: no PVE API schema to check against: pass --pve-schema FILE "
              "(a node's /pve-docs/api-viewer/apidoc.js), or --no-pve-schema to check the format only",
              file=sys.stderr)  # fmt: skip
        return 1
    problems = [p for s in schemas for p in check_catalog(catalog, s)] + unmatched_versions(catalog, schemas)
    counts: dict[str, int] = {}
    for t in catalog:
        counts[t.connector] = counts.get(t.connector, 0) + 1
    for p in problems:
        print(f"FAIL {p}")
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    if not schemas:
        print(f"{len(catalog)} tools ({kinds}); connector format OK")
        print("WARNING: --no-pve-schema: no pve_api method, path or parameter was checked against Proxmox's API",
              file=sys.stderr)  # fmt: skip
        return 0
    against = ", ".join(s.source for s in schemas)
    print(f"{len(catalog)} tools ({kinds}); pve_api endpoints checked against {against}: "
          f"{'OK' if not problems else f'{len(problems)} problem(s)'}")  # fmt: skip
    return 1 if problems else 0


def _list(args: argparse.Namespace) -> int:
    catalog = _load(args.connectors)
    if catalog is None:
        return 1
    for t in sorted(catalog, key=lambda t: (t.domain, t.name)):
        print(f"{t.name:<28} {t.effect:<8} {t.domain:<10} {t.connector:<10} {t.title}")
    return 0


def _request_lines(tool: Tool) -> list[str]:
    if tool.connector == "pve_api":
        lines = [f"{m} {p}" for m, p, _ in expansions(tool)]
        for key in ("query", "body", "fixed"):
            if tool.spec.get(key):
                lines.append(f"  {key}: {json.dumps(tool.spec[key])}")
        if tool.spec.get("task"):
            lines.append(f"  task: {tool.spec['task']} (timeout {tool.spec.get('task_timeout', 60)}s)")
        return lines
    if tool.connector == "ssh":
        return [
            "argv: " + json.dumps(tool.spec["argv"]),
            f"  on node: {tool.spec['node']}, parse: {tool.spec['parse']}",
        ]
    return [f"reducer {tool.spec['reducer']} over: {', '.join(tool.spec['uses'])}"]


def _show(args: argparse.Namespace) -> int:
    catalog = _load(args.connectors)
    if catalog is None:
        return 1
    tool = catalog.get(args.name)
    if tool is None:
        print(f"error: no tool named {args.name}", file=sys.stderr)
        return 1
    # a schema that cannot be read fails the command, said first: one given by --pve-schema, or by
    # $PVEGATE_PVE_SCHEMA / $PVEGATE_PVE_SCHEMA_DIR (else the shipped ones), as `pvegate check` has it
    schemas = _schemas(args.pve_schema)
    if schemas is None:
        return 1
    print(f"{tool.name}: {tool.title}\n  {tool.description}")
    print(f"effect {tool.effect}, domain {tool.domain}, scope {tool.scope}, connector {tool.connector}")
    if tool.pve_versions:
        print(f"works on: {tool.versions_text()} (refused on a cluster of another version)")
    print("annotations: " + json.dumps(tool.annotations))
    print("sends:")
    for line in _request_lines(tool):
        print("  " + line)
    if tool.dry_run:
        print(f"dry run: {tool.dry_run}")
    fitting = [s for s in schemas if applies(tool, s)]
    if tool.connector == "pve_api" and fitting:
        s = fitting[-1]
        privs, notes = privileges(tool, s)
        print(f"Proxmox privileges (from {s.source}):")
        for p in privs:
            print(f"  {p}")
        for n in notes:
            print(f"  note: {n}")
        if not privs and not notes:
            print("  none beyond a valid token")
    print("parameters: " + json.dumps(tool.parameters, indent=2))
    return 0


def _least(args: argparse.Namespace) -> int:
    catalog = _load(args.connectors)
    schemas = _schemas(args.pve_schema)
    if catalog is None or not schemas:
        print("error: need the catalog and a PVE schema (--pve-schema)", file=sys.stderr)
        return 1
    effects = tuple(e.strip() for e in args.effects.split(",") if e.strip())
    known = sorted({t.effect for t in catalog})
    unknown = [e for e in effects if e not in known]
    if unknown or not effects:
        what = f"unknown effect(s) {', '.join(unknown)}" if unknown else "no effect given"
        print(f"error: --effects: {what}; the catalog's effects are {', '.join(known)}", file=sys.stderr)
        return 2
    need = least_privilege(catalog, schemas, effects)
    privs_list = role_privileges(need)
    for priv in privs_list:
        why = [", ".join(sorted(need[priv]))] if priv in need else []
        if priv in GATEWAY_READS:
            why.append(GATEWAY_READS[priv])
        print(f"# {priv}: {'; '.join(why)}")
    privs = " ".join(privs_list)
    # quoted for the shell they are pasted into (the arguments' syntax is checked too: _role_id, _token_id)
    print(f"pveum role add {shlex.quote(args.role)} -privs {shlex.quote(privs)}")
    print(f"pveum acl modify / -token {shlex.quote(args.token_id)} -role {shlex.quote(args.role)}")
    print("# SSH tools (node_*, lxc_docker_*, list_guest_containers, ...) use the SSH key, not this token.")
    return 0


# Proxmox VE's own syntax (PVE::AccessControl: pve-roleid; a user is name@realm, a token user!tokenid)
_ROLE_ID = re.compile(r"[A-Za-z0-9._-]+")
_TOKEN_ID = re.compile(r"[^\s:/]+@[A-Za-z][A-Za-z0-9._-]+![A-Za-z][A-Za-z0-9._-]+")


def _role_id(text: str) -> str:
    if not _ROLE_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a Proxmox role id (letters, digits, . - _): {text!r}")
    return text


def _token_id(text: str) -> str:
    if not _TOKEN_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a Proxmox API token id (USER@REALM!TOKENID): {text!r}")
    return text


def register(sub: Any) -> None:
    c = sub.add_parser("check", help="validate connector files against the format and a PVE API schema")
    c.add_argument("--connectors", type=Path, default=DEFAULT_CONNECTORS, help="the connector directory")
    src = c.add_mutually_exclusive_group()
    src.add_argument(
        "--pve-schema",
        type=Path,
        action="append",
        help="apidata JSON (or .gz) or a node's apidoc.js (repeatable; default: PVE 8.4 and 9.1 as shipped, "
        f"or those in ${ENV_DIR})",
    )
    src.add_argument(
        "--no-pve-schema",
        action="store_true",
        help="check the connector format only: no endpoint is checked against Proxmox's API (says so)",
    )
    c.set_defaults(func=_check)

    t = sub.add_parser("tools", help="inspect the tool catalog")
    tsub = t.add_subparsers(dest="tools_command", required=True)
    ls = tsub.add_parser("list", help="every tool with effect, domain and connector")
    ls.add_argument("--connectors", type=Path, default=DEFAULT_CONNECTORS, help="the connector directory")
    ls.set_defaults(func=_list)
    sh = tsub.add_parser("show", help="one tool: what it sends and the Proxmox privilege it needs")
    sh.add_argument("name", help="the tool name")
    sh.add_argument("--connectors", type=Path, default=DEFAULT_CONNECTORS, help="the connector directory")
    sh.add_argument("--pve-schema", type=Path, action="append", help="apidata JSON or apidoc.js, for the privileges")
    sh.set_defaults(func=_show)
    lp = tsub.add_parser("least-privilege", help="print a Proxmox role with only the privileges the tools need")
    lp.add_argument("--connectors", type=Path, default=DEFAULT_CONNECTORS, help="the connector directory")
    lp.add_argument(
        "--pve-schema",
        type=Path,
        action="append",
        help="apidata JSON or apidoc.js (each tool uses the last one describing a release it works on)",
    )
    lp.add_argument("--effects", default="read,write,destroy", help="comma list of effects to cover")
    lp.add_argument("--role", type=_role_id, default="PVEGate", help="the Proxmox role name to create")
    lp.add_argument(
        "--token-id",
        type=_token_id,
        default="pvegate@pve!gateway",
        help="the API token (USER@REALM!TOKENID) to grant it to",
    )
    lp.set_defaults(func=_least)
