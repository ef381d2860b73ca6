"""`pvegate bundle build` refuses policy data naming a tool or argument the gateway's catalog lacks.

The build runs every policy check (scripts/policy-checks.sh, `pvegate policy check` among them)
against the tool catalog of `--connectors` (default: this installation's connectors/).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.policy.opa_sidecar import REPO_ROOT


def _tree(tmp_path: Path, old: str, new: str) -> Path:
    """policies/ whose data names the tool `old` as `new` (the golden cases go: they name it right)."""
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree, ignore=shutil.ignore_patterns("golden"))
    data = tree / "data" / "data.yaml"
    text = data.read_text()
    assert old in text
    data.write_text(text.replace(old, new))
    yaml.safe_load(data.read_text())
    return tree


def test_build_refuses_data_naming_a_tool_the_catalog_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _tree(tmp_path, "node_reboot", "node_rebot")
    out = tmp_path / "b.tar.gz"
    rc = main(["bundle", "build", "--policies", str(tree), "--unsigned", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and not out.exists()
    assert "risk.critical_calls.4.tools: node_rebot names no tool in the catalog (misspelled?)" in err
    assert "nothing was built" in err


def test_build_checks_against_the_connectors_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a gateway whose connectors call the tool sdn_commit, and data written for it
    tree = _tree(tmp_path, "sdn_apply", "sdn_commit")
    connectors = tmp_path / "connectors"
    shutil.copytree(REPO_ROOT / "connectors", connectors)
    for f in connectors.glob("*.yaml"):
        f.write_text(f.read_text().replace("name: sdn_apply\n", "name: sdn_commit\n"))
    out = tmp_path / "b.tar.gz"
    argv = ["bundle", "build", "--policies", str(tree), "--unsigned", "-o", str(out)]
    assert main([*argv, "--connectors", str(tmp_path / "nowhere")]) == 1
    assert "no connector directory" in capsys.readouterr().err and not out.exists()
    assert main([*argv, "--connectors", str(connectors)]) == 0, capsys.readouterr().err
    assert out.exists()
