"""YAML that costs too much to read: refused with a clear problem, not a hang or a traceback.

An alias bomb ("billion laughs": nine aliases of nine aliases, nine levels deep) in the
configuration hung `pvegate config check` and `pvegate serve` for good (PyYAML shares the
aliased nodes, but the configuration's checks walk every repetition: 387 million), and the same
bomb in a connector file hung `pvegate check` and the gateway's start while taking gigabytes. A
document nested deeper than Python's recursion (`x: [[[[...]]]]`, 5000 levels) ended both
commands with a RecursionError traceback. core/yamlread.py, which reads the configuration, the
connectors and the policy data, now names both as problems of the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core import yamlread
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog, CatalogError
from tests.config.conftest import run_pvegate, write


def _bomb(indent: str) -> str:
    lines = [f'{indent}x0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"{indent}x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\n"


DEEP = "x: " + "[" * 5000 + "]" * 5000 + "\n"


def _merge_chain(indent: str) -> str:
    """Merges of merges (review): each level merges the one below twice; the merge checks walked
    every path through them (2^30) before the bomb was sized."""
    lines = [f"{indent}m0: &m0 {{k: v}}"]
    lines += [f"{indent}m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: v}}" for i in range(1, 31)]
    return "\n".join(lines) + "\n"


def _config(tmp_path: Path, base: dict[str, Any], tail: str) -> Path:
    path = write(tmp_path, base)
    path.write_text(path.read_text() + tail)
    return path


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        # an unknown key's value, and a passed-through OPA section: both were walked in full
        (_bomb(""), "aliases repeat more than 100000 nodes"),
        ("opa:\n  bundles:\n    b:\n" + _bomb("      "), "aliases repeat more than 100000 nodes"),
        (DEEP, "nested too deeply to read"),
        (_merge_chain(""), "aliases repeat more than 100000 nodes"),
    ],
)
@pytest.mark.parametrize("command", ["check", "serve"])
def test_config_refused_at_once(tmp_path: Path, base: dict[str, Any], tail: str, message: str, command: str) -> None:
    path = _config(tmp_path, base, tail)
    args = ("config", "check", str(path)) if command == "check" else ("serve", "--config", str(path))
    out = run_pvegate(*args, timeout=30)
    assert out.returncode in (1, 2), out
    assert message in out.stdout + out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("tail", [_bomb("        "), DEEP])
def test_connector_refused_at_once(tmp_path: Path, tail: str) -> None:
    connectors = tmp_path / "connectors"
    connectors.mkdir()
    for f in (REPO_ROOT / "connectors").glob("*.yaml"):
        (connectors / f.name).write_text(f.read_text())
    guests = connectors / "guests.yaml"
    text = guests.read_text()
    if tail is DEEP:
        text += tail
    else:  # in a tool's `fixed` arguments, which the catalog's schema leaves free
        assert "      fixed: {type: vm}\n" in text
        text = text.replace("      fixed: {type: vm}\n", "      fixed:\n        type: vm\n" + tail, 1)
    guests.write_text(text)
    out = run_pvegate("check", "--connectors", str(connectors), "--no-pve-schema", timeout=30)
    assert out.returncode == 1, out
    assert "Traceback" not in out.stderr
    with pytest.raises(CatalogError, match=r"aliases repeat more than|nested too deeply"):  # the gateway's start
        Catalog.load(connectors)


def test_shipped_anchors_still_read() -> None:
    """The shipped connectors' anchors (the most repeat about 1,300 nodes) stay well within the limit."""
    for f in sorted((REPO_ROOT / "connectors").glob("*.yaml")):
        assert yamlread.load(f.read_text()) == yaml.safe_load(f.read_text())
    few = "a: &a [1, 2, 3]\nb: *a\nc: {<<: {k: *a}}\n"
    assert yamlread.load(few) == yaml.safe_load(few)
