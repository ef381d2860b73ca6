"""What `pvegate bundle build` signs is exactly what its checks saw: the tree is copied once, the checks
run on the copy and the bundle is built from it, so an edit made while the checks run (they take
~25 s) is neither checked nor signed. And a tree whose decision-log mask leaves the tool arguments
is refused; policy data nested too deeply to read is refused in one line. Real opa."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.policy import bundles
from gateway.policy.bundles import BundleError, build, log_mask_problem
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable, check_yaml_data


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    return tree


def _data(bundle: Path) -> dict[str, Any]:
    with tarfile.open(bundle) as tar:
        f = tar.extractfile("/data.json") if "/data.json" in tar.getnames() else tar.extractfile("data.json")
        assert f is not None
        doc: dict[str, Any] = json.load(f)
        return doc


def test_an_edit_made_while_the_checks_run_is_not_signed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of repro_toctou.sh made deterministic: the checks' stand-in edits the live tree (a data
    key the checks refuse) while they "run", then reports the tree it was given as passing."""
    tree = _tree(tmp_path)
    seen: list[Path] = []

    def checks(policies: Path, connectors: Path | None = None) -> tuple[bool, str]:
        seen.append(policies)
        data = tree / "data" / "data.yaml"
        data.write_text(data.read_text().replace("\nroles:", "\nrolez_typo: 1\nroles:", 1))
        assert "rolez_typo" not in (policies / "data" / "data.yaml").read_text(), "the checks see the live tree"
        return True, "policy checks passed"

    monkeypatch.setattr(bundles, "run_checks", checks)
    out = tmp_path / "b.tar.gz"
    build(tree, out, None, unsigned=True, optimize=False)
    assert "rolez_typo" in (tree / "data" / "data.yaml").read_text()  # the edit did land in the tree
    assert "rolez_typo" not in _data(out)  # and is not in what was built
    (checked,) = seen
    assert checked.resolve() != tree.resolve() and not checked.exists()  # a private copy, gone after the build


def test_the_checks_get_the_copy_that_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file signed is byte for byte the file the checks were given."""
    tree = _tree(tmp_path)
    snapshot: dict[str, bytes] = {}

    def checks(policies: Path, connectors: Path | None = None) -> tuple[bool, str]:
        assert (policies / ".regal" / "config.yaml").is_file() and (policies / "golden").is_dir()  # the whole tree
        snapshot.update({str(p.relative_to(policies)): p.read_bytes() for p in policies.rglob("*") if p.is_file()})
        for rego in tree.rglob("decision.rego"):
            rego.write_text(rego.read_text() + "\n# changed after the checks began\n")
        return True, "policy checks passed"

    monkeypatch.setattr(bundles, "run_checks", checks)
    out = tmp_path / "b.tar.gz"
    build(tree, out, None, unsigned=True, optimize=False)
    with tarfile.open(out) as tar:
        for m in tar.getmembers():
            name = m.name.lstrip("/")
            if not m.isfile() or name in (".manifest", "data.json") or name.startswith("system/authz"):
                continue
            f = tar.extractfile(m)
            assert f is not None and f.read() == snapshot[name], name


def test_a_failing_check_names_the_callers_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(tmp_path)

    def checks(policies: Path, connectors: Path | None = None) -> tuple[bool, str]:
        return False, f"{policies.resolve()}/pvegate/x.rego: bad\npolicy checks FAILED: opa test"

    monkeypatch.setattr(bundles, "run_checks", checks)
    with pytest.raises(BundleError) as err:
        build(tree, tmp_path / "b.tar.gz", None, unsigned=True)
    assert str(err.value).startswith("policy checks FAILED: opa test; nothing was built")
    assert f"{tree}/pvegate/x.rego: bad" in str(err.value)
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_tree_without_the_decision_log_mask_is_not_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _tree(tmp_path)
    assert log_mask_problem(tree) is None
    shutil.rmtree(tree / "system" / "log")
    problem = log_mask_problem(tree)
    assert problem is not None and "data.system.log.mask" in problem and '"/input/arguments"' in problem
    monkeypatch.setattr(bundles, "run_checks", lambda policies, connectors=None: (True, "policy checks passed"))
    out = tmp_path / "b.tar.gz"
    with pytest.raises(BundleError, match=r"data.system.log.mask .* nothing was built$"):
        build(tree, out, None, unsigned=True)
    assert not out.exists()
    build(tree, out, None, unsigned=True, checks=False, optimize=False)  # a test's own variant: as before


def _deep(tree: Path) -> Path:
    extra = tree / "data" / "extra"
    extra.mkdir()
    deep = extra / "data.json"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    return deep


def test_policy_data_nested_too_deeply_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """repro_deep.sh: a RecursionError traceback from the strict data read at a managed OPA's start."""
    tree = _tree(tmp_path)
    deep = _deep(tree)
    with pytest.raises(OPAUnavailable) as err:
        check_yaml_data((tree,))
    assert str(err.value) == f"policy data {deep}: nested too deeply to read (no policy data needs that depth)"
    sidecar = OPASidecar(policies=(tree,))
    try:
        with pytest.raises(OPAUnavailable, match="nested too deeply"):
            sidecar.start(timeout=20)
        assert sidecar.process is None
    finally:
        sidecar.stop()
    golden = REPO_ROOT / "policies" / "golden" / "admin_delete_in_window_approved.json"
    rc = main(["policy", "eval", "--policies", str(tree), "-i", str(golden)])
    err_text = capsys.readouterr().err
    assert rc != 0 and "nested too deeply" in err_text and "Traceback" not in err_text, err_text
    deep.with_suffix(".yaml").write_text("- " * 5_000 + "x\n")  # YAML too
    deep.unlink()
    with pytest.raises(OPAUnavailable, match="nested too deeply"):
        check_yaml_data((tree,))
