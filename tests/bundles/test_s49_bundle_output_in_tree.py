"""`pvegate bundle build -o` naming a file inside the policy directory was built and signed, and the archive
then sat in the tree: OPA loading the tree, and every later build, refused it ("a bundle archive inside the
policy directory") far from the command that put it there. The build now refuses it before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gateway.policy.bundles import BundleError, build
from gateway.policy.opa_sidecar import REPO_ROOT


def test_a_bundle_written_into_the_policy_tree_is_refused_before_building(tmp_path: Path) -> None:
    tree = tmp_path / "policies"
    shutil.copytree(REPO_ROOT / "policies", tree)
    for out in (
        tree / "b.tar.gz",
        tree / "pvegate" / "out" / "b.tar.gz",
        tmp_path / "policies" / ".." / "policies" / "c.tar.gz",
    ):
        with pytest.raises(BundleError, match="inside the policy directory"):
            build(tree, out, None, unsigned=True, checks=False, optimize=False)
        assert not out.exists()
    assert not (tree / "pvegate" / "out").exists()
    # beside the tree is fine
    build(tree, tmp_path / "b.tar.gz", None, unsigned=True, checks=False, optimize=False)
    assert (tmp_path / "b.tar.gz").is_file()
