"""The catalog refuses names that keep a secret in, or a field to one guest type, when they name nothing.

A typo in `sensitive` or `secret_output` passes the file schema (a list of strings) and would let
the secret through: the audit keeps the argument, the result shows the value. Found by a review
that loaded `sensitive: [pasword]` on user_create and `secret_output: [valeu]` on token_create.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core import yamlread
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog, CatalogError

CONNECTORS = REPO_ROOT / "connectors"


def _with(tmp_path: Path, file: str, tool: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A connectors directory holding `file` with `tool` edited, and the shared parameters."""
    doc = yaml.safe_load((CONNECTORS / file).read_text())
    (raw,) = [t for t in doc["tools"] if t["name"] == tool]
    edit(raw)
    (tmp_path / file).write_text(yaml.safe_dump(doc))
    (tmp_path / "params.yaml").write_text((CONNECTORS / "params.yaml").read_text())
    return tmp_path


@pytest.mark.parametrize(
    ("file", "tool", "edit", "message"),
    [
        (
            "access.yaml",
            "user_create",
            lambda t: t.update(sensitive=["pasword"]),
            "sensitive 'pasword' is neither one of its parameters or output fields nor a field Proxmox's API has",
        ),
        (
            "access.yaml",
            "token_create",
            lambda t: t.update(secret_output=["valeu"]),
            "secret_output 'valeu' is not one of its output fields",
        ),
        (
            "guests.yaml",
            "get_guest_stored_config",
            lambda t: t.update(sensitive=["cipassword", "enviroment"]),
            "sensitive 'enviroment'",
        ),
        (
            "snapshots.yaml",
            "snapshot_create",
            lambda t: t["pve_api"].update(type_only={"vmstat": "qemu"}),
            "type_only 'vmstat' is not a field it sends",
        ),
    ],
    ids=["sensitive-param", "secret-output", "sensitive-config-key", "type-only"],
)
def test_a_name_that_names_nothing_is_refused(
    tmp_path: Path, file: str, tool: str, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    with pytest.raises(CatalogError) as err:
        Catalog.load(_with(tmp_path, file, tool, edit))
    assert message in str(err.value) and f"tool {tool}" in str(err.value)


def test_names_proxmox_uses_are_accepted(tmp_path: Path) -> None:
    """A config key Proxmox returns (not a parameter or a declared field) is what most lists name."""
    catalog = Catalog.load(
        _with(
            tmp_path,
            "guests.yaml",
            "get_guest_stored_config",
            lambda t: t.update(sensitive=["cipassword", "hookscript"]),
        )
    )
    assert catalog.tools["get_guest_stored_config"].sensitive == ("cipassword", "hookscript")


def test_the_shipped_catalog_loads_the_same_twice() -> None:
    """The second load in a process skips the checks already passed (same texts): same tools."""
    first, second = Catalog.load(CONNECTORS), Catalog.load(CONNECTORS)
    assert first.tools.keys() == second.tools.keys()
    for name, tool in first.tools.items():
        other = second.tools[name]
        assert (tool.parameters, tool.policy_view, tool.spec, tool.sensitive) == (
            other.parameters,
            other.policy_view,
            other.spec,
            other.sensitive,
        )


def test_a_bad_parameters_schema_names_the_parameter(tmp_path: Path) -> None:
    bad = {"type": "string", "maxLength": -1}
    with pytest.raises(CatalogError, match=r"tool user_create: bad parameters schema: password: -1 is less than"):
        Catalog.load(_with(tmp_path, "access.yaml", "user_create", lambda t: t["params"].update(password=bad)))


def test_every_shipped_yaml_reads_alike_with_either_parser() -> None:
    """libyaml's parser (the fast path) and PyYAML's own read each shipped file to the same value."""
    files = [*CONNECTORS.glob("*.yaml"), *(REPO_ROOT / "policies" / "data").glob("*.yaml")]
    assert files
    for f in files:
        text = f.read_text()
        assert yamlread._load(text, yaml.CSafeLoader) == yamlread._load(text, yaml.SafeLoader), f


def test_not_yaml_is_reported_with_the_line_quoted() -> None:
    """The error text is the pure Python parser's, which shows the line and the column."""
    with pytest.raises(yaml.YAMLError) as err:
        yamlread.load("a: [1\nb: 2\n")
    assert "^" in str(err.value) and "line" in str(err.value)
