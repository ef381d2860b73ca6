"""A bundle decides as the policy directory it was built from, or is not built.

OPA loads a policy directory and a bundle differently: from a directory every .json/.yaml file
is data at its directory's path, and a bundle archive (*.tar.gz) inside it is loaded too; from a
bundle only data files named data.json/data.yaml/data.yml are data, the others are carried and
ignored without a word. `pvegate bundle build` refuses a tree whose bundle would decide otherwise
than the directory, and no policy directory may hold a bundle archive (nothing that identifies or
checks the policy covers it).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from gateway.policy.bundles import BundleError, build, manifest_of
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable, find_opa
from gateway.policy.revision import files_revision

GOLDEN = "contractor_may_not_read_node_network"


def _golden(name: str) -> dict[str, Any]:
    doc = json.loads((REPO_ROOT / "policies" / "golden" / f"{name}.json").read_text())
    case: dict[str, Any] = doc[name]
    return case


def _decide(opa: OPASidecar, input_doc: dict[str, Any]) -> dict[str, Any]:
    opa.start(timeout=20)
    try:
        with opa.client(timeout=5) as c:
            r = c.post("/v1/data/pvegate/decision", json={"input": input_doc})
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()["result"]
        return result
    finally:
        opa.stop()


def _split_tree(tmp_path: Path) -> Path:
    """The shipped policies with the guard rails moved to data/guardrails.yaml: the same data to a
    policy directory (both files are data.data), half of it to a bundle."""
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    data = yaml.safe_load((tree / "data" / "data.yaml").read_text())
    guardrails = {"guardrails": data.pop("guardrails")}
    (tree / "data" / "data.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tree / "data" / "guardrails.yaml").write_text(yaml.safe_dump(guardrails, sort_keys=False))
    return tree


def test_build_refuses_data_a_bundle_would_not_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _split_tree(tmp_path)
    case = _golden(GOLDEN)
    # the directory decides with the moved guard rails (its deny rule holds)
    directory = _decide(OPASidecar(policies=(tree,), optimize=False), case["input"])
    assert directory["allow"] is False and directory["deny"]

    out = tmp_path / "b.tar.gz"
    with pytest.raises(BundleError) as err:
        build(tree, out, None, unsigned=True, checks=False)
    message = str(err.value)
    assert str(tree / "data" / "guardrails.yaml") in message and "data.yaml" in message
    assert "nothing was built" in message and not out.exists()
    # the CLI says so too, before any check runs
    rc = main(["bundle", "build", "--policies", str(tree), "--unsigned", "-o", str(out)])
    assert rc == 1 and "guardrails.yaml" in capsys.readouterr().err and not out.exists()


def test_a_legal_tree_builds_a_bundle_that_decides_as_the_directory(tmp_path: Path) -> None:
    case = _golden(GOLDEN)
    directory = _decide(OPASidecar(policies=(REPO_ROOT / "policies",), optimize=False), case["input"])
    out = tmp_path / "b.tar.gz"
    build(REPO_ROOT / "policies", out, None, unsigned=True, checks=False)
    bundled = _decide(OPASidecar(bundle=out), case["input"])
    assert bundled["allow"] is directory["allow"] is False
    assert bundled["deny"] == directory["deny"] and bundled["deny"]
    assert bundled["deny_reasons"] == directory["deny_reasons"]


def test_a_data_file_at_the_top_of_the_tree_roots_its_keys(tmp_path: Path) -> None:
    """data.json beside the packages is data at the root: the bundle's roots are its keys."""
    tree = tmp_path / "other"
    (tree / "app").mkdir(parents=True)
    (tree / "app" / "p.rego").write_text("package app\n\nallow := data.extra.on\n")
    (tree / "data.json").write_text('{"extra": {"on": true}}')
    out = tmp_path / "b.tar.gz"
    build(tree, out, None, unsigned=True, checks=False, optimize=False)
    assert set(manifest_of(out)["roots"]) == {"app", "extra", "system/authz"}  # type: ignore[arg-type]
    done = subprocess.run(
        [str(find_opa()), "eval", "-f", "raw", "-b", str(out), "data.app.allow"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "true", done.stderr


def _archive_in(tree: Path, tmp_path: Path) -> Path:
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "e.rego").write_text("package extra\n\non := true\n")
    archive = tree / "pvegate" / "extra.tar.gz"
    subprocess.run([str(find_opa()), "build", "-b", ".", "-o", str(archive)], cwd=inner, check=True)
    return archive


def test_a_policy_directory_holding_a_bundle_archive_is_refused(tmp_path: Path) -> None:
    """OPA would load the archive from the directory, but neither the `files:` revision nor the
    checks nor the optimised build's cache see it: a changed archive would decide unnoticed."""
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    archive = _archive_in(tree, tmp_path)
    with pytest.raises(OPAUnavailable, match="bundle archive") as err:
        OPASidecar(policies=(tree,)).start(timeout=20)
    assert str(archive) in str(err.value)
    with pytest.raises(OPAUnavailable, match="bundle archive"):
        files_revision((tree,))
    with pytest.raises(BundleError, match="bundle archive"):
        build(tree, tmp_path / "b.tar.gz", None, unsigned=True, checks=False)
    # where OPA does not look (golden cases, dot-directories), an archive is nobody's business
    archive.rename(tree / "golden" / "extra.tar.gz")
    assert files_revision((tree,)).startswith("files:")
