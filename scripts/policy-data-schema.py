#!/usr/bin/env python3
"""Write (or --check) policies/pvegate/config/data_schema.rego from the policy data's JSON Schema.

The JSON Schema of data.yaml is policies/pvegate/config/schema/data.json (for editors,
`pvegate policy check` and people). The policy validates its data against the same schema
as a Rego constant, so that the check works wherever the policy files are mounted (a
`policies/` directory, `policies/pvegate` beside a data directory of one's own, a bundle);
a data document's path would depend on the mount point. `--check` fails when the constant
is stale. Descriptions and titles are left out of the constant: validation ignores them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("pvegate") / "config" / "schema" / "data.json"
OUT = Path("pvegate") / "config" / "data_schema.rego"
ANNOTATIONS = ("description", "title", "$comment")

HEADER = """\
# Generated from schema/data.json by scripts/policy-data-schema.py: do not edit.
# The JSON Schema of the policy data (data.yaml), without its descriptions, as
# a constant: problems in config.rego validates data.data against it.
package pvegate.config

# regal ignore:rule-length
data_schema := """


def _strip(doc: Any, in_properties: bool = False) -> Any:
    if isinstance(doc, dict):
        return {
            k: _strip(v, k == "properties")
            for k, v in doc.items()
            if in_properties or k not in ANNOTATIONS  # a property named "description" stays
        }
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def _compact(doc: Any, depth: int = 0, prefix: int = 0) -> str:
    """JSON with small objects and lists on one line, lines within Regal's 130 columns.

    prefix: the columns before the value on its line (indent, key). opa fmt and Regal's
    formatter disagree on breaking an object whose only value is a broken list, so a list
    of scalars stays on one line when it fits, and the schema gives long enums a type too.
    """
    flat = json.dumps(doc)
    scalars = isinstance(doc, list) and not any(isinstance(v, dict | list) for v in doc)
    if not isinstance(doc, dict | list) or not doc or prefix + len(flat) + 1 <= (128 if scalars else 120):
        return flat
    pad = "\t" * (depth + 1)
    if isinstance(doc, dict):
        items = []
        for k, v in doc.items():
            key = f"{json.dumps(k)}: "
            items.append(f"{pad}{key}{_compact(v, depth + 1, depth + 1 + len(key))},")
        return "{\n" + "\n".join(items) + "\n" + "\t" * depth + "}"
    items = [f"{pad}{_compact(v, depth + 1, depth + 1)}," for v in doc]
    return "[\n" + "\n".join(items) + "\n" + "\t" * depth + "]"


def render(policies: Path) -> str:
    schema = _strip(json.loads((policies / SOURCE).read_text()))
    text = HEADER + _compact(schema) + "\n"
    opa = os.environ.get("OPA") or str(ROOT / ".tools" / "bin" / "opa")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data_schema.rego"
        path.write_text(text)
        subprocess.run([opa, "fmt", "-w", str(path)], check=True, capture_output=True, timeout=60)
        return path.read_text()


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--check"]
    policies = Path(args[0]) if args else ROOT / "policies"  # usage: [--check] [POLICY_DIR]
    out = policies / OUT
    text = render(policies)
    if "--check" in sys.argv[1:]:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run python3 scripts/policy-data-schema.py {policies}")
            return 1
        print(f"{out} is current")
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
