"""Proxmox VE's own API schema, shipped with pvegate as data (see README.md here).

The files beside this module are Proxmox's AGPL-3.0-or-later `apidata` JSON,
gzip-compressed and unmodified. pvegate reads them only as data: `pvegate check`
validates connectors against them and the simulator validates requests with them.
`PVEGATE_PVE_SCHEMA_DIR` points at another directory holding the same file names
(plain or `.gz`); `load_tree` also reads a node's `apidoc.js` without running it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from gateway.core import usercache

ENV_DIR = "PVEGATE_PVE_SCHEMA_DIR"
SHIPPED_DIR = Path(__file__).resolve().parent
VERSIONS = ("8.4", "9.1")  # the PVE lines shipped: one per major version


class SchemaNotFound(Exception):
    """No schema file for a PVE version in the directory that was asked."""


def schema_dir() -> Path:
    """$PVEGATE_PVE_SCHEMA_DIR when set, else the files shipped in this package."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else SHIPPED_DIR


def version_for(major: int) -> str:
    return "9.1" if major >= 9 else "8.4"


def schema_file(version: str, directory: Path | None = None) -> Path:
    """`pve-<version>-apidata.json` in the directory, or its `.gz`; SchemaNotFound if neither."""
    d = directory if directory is not None else schema_dir()
    for name in (f"pve-{version}-apidata.json", f"pve-{version}-apidata.json.gz"):
        if (d / name).is_file():
            return d / name
    raise SchemaNotFound(f"no PVE {version} API schema (pve-{version}-apidata.json or .json.gz) in {d}")


def load_tree(path: Path) -> list[dict[str, Any]]:
    """The schema's tree from apidata JSON, its .gz, or an apidoc.js (the JavaScript is skipped, never run)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8")
    start = text.find("[")
    if start < 0:
        raise ValueError(f"{path}: no JSON array found")
    tree, _ = json.JSONDecoder().raw_decode(text[start:])
    if not isinstance(tree, list):
        raise ValueError(f"{path}: the schema is not a JSON array")
    return tree


@cache
def field_names() -> frozenset[str]:
    """Every parameter and returned property name in the shipped schemas, all versions: what a
    connector's `sensitive` list may name besides its own parameters and output fields (a name
    Proxmox never uses is a typo, and a typo would let the secret through). The shipped files, not
    $PVEGATE_PVE_SCHEMA_DIR: the catalog's check must not depend on where a user points.

    Reading the schemas takes ~100 ms of every start, so the names are kept in the user's private
    cache directory (core.usercache) under the digest of the files they come from."""
    files = [schema_file(version, SHIPPED_DIR) for version in VERSIONS]
    raw = [f.read_bytes() for f in files]
    kept = usercache.private_dir("pve-schema")
    key = usercache.digest(_NAMES_CODE, *raw)[:32]  # the files read and the code that reads them
    cached = None if kept is None else kept / f"field-names-{key}.json"
    if cached is not None and (text := usercache.read_text(cached)) is not None:
        with contextlib.suppress(ValueError, RecursionError):
            got = json.loads(text)
            if isinstance(got, list) and got and all(isinstance(n, str) for n in got):
                return frozenset(got)
    names = _field_names(files)
    if cached is not None:
        usercache.write_atomically(cached, json.dumps(sorted(names)))
    return names


# Part of the kept names' key: change it with _field_names, so that names another version of the
# code read from the same files are not taken for this one's.
_NAMES_CODE = "field-names 1: parameters, returns, returns.items"


def _field_names(files: list[Path]) -> frozenset[str]:
    names: set[str] = set()
    for file in files:
        stack = list(load_tree(file))
        while stack:
            node = stack.pop()
            for info in (node.get("info") or {}).values():
                names.update((info.get("parameters") or {}).get("properties") or {})
                returns = info.get("returns") or {}
                names.update(returns.get("properties") or {})
                names.update((returns.get("items") or {}).get("properties") or {})
            stack.extend(node.get("children") or [])
    return frozenset(names)
