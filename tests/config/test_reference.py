"""docs/configuration.md is generated from the schema and must not drift from it."""

from __future__ import annotations

import re

from gateway.core.config_schema import reference, settings
from gateway.policy.opa_sidecar import REPO_ROOT

DOC = REPO_ROOT / "docs" / "configuration.md"
REGENERATE = "pvegate config reference -o docs/configuration.md"


def test_committed_reference_matches_the_schema() -> None:
    assert DOC.read_text() == reference(), f"docs/configuration.md is out of date: run `{REGENERATE}`"


def test_reference_lists_every_setting_with_type_and_description() -> None:
    text = reference()
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]  # \| inside a cell is text
            rows[cells[0].strip("`")] = cells
    for path, node in settings():
        parent = path.rsplit(".", 1)[0]
        if parent in rows and rows[parent][1].startswith("secret"):
            continue  # a secret's file/env: explained once, below the table
        assert path in rows, path
        cells = rows[path]
        assert cells[1], f"{path}: no type"
        assert cells[3] == " ".join(node["description"].split()).replace("|", "\\|"), path
    assert "| `clusters[].timeout` | number (> 0, <= 3600) | `10.0` |" in text
    assert "| `auth.issuer` | string | required |" in text


def test_deployment_guide_links_the_reference() -> None:
    assert "(configuration.md)" in (REPO_ROOT / "docs" / "deployment.md").read_text()
