"""A bundle's manifest said `git_dirty: false` for content no commit holds.

`pvegate bundle build` writes the commit the policy tree is at and whether the tree had changes
(`git_commit`, `git_dirty`, signed with the rest): a reader takes a clean bundle's content to be
that commit's. The dirty check was `git status --porcelain -- .`, which does not list files git
ignores, nor untracked files where `status.showUntrackedFiles=no`, and whose failure (a corrupt
index, a timeout) read as "no changes": a bundle carrying a policy file that is in no commit was
signed as clean. Now every file the bundle carries must be in the commit unchanged, and a status
git cannot give is dirty.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.policy.bundles import build, manifest_of
from gateway.policy.opa_sidecar import REPO_ROOT


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args], check=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A policy repository with its tree committed; a .gitignore as a site might keep one."""
    top = tmp_path / "repo"
    top.mkdir()
    _git(top, "init", "-q")
    shutil.copytree(REPO_ROOT / "policies", top / "policies")
    (top / ".gitignore").write_text("policies/pvegate/site/\n__pycache__/\n")
    _git(top, "add", "-A")
    _git(top, "commit", "-qm", "policies")
    return top


def _dirty(repo: Path, tmp_path: Path) -> object:
    out = tmp_path / "out" / "b.tar.gz"
    build(repo / "policies", out, None, unsigned=True, checks=False, optimize=False)
    meta = manifest_of(out)["metadata"]
    assert isinstance(meta, dict)
    return meta["git_dirty"]


def _site_rule(repo: Path) -> None:
    (repo / "policies" / "pvegate" / "site").mkdir()
    (repo / "policies" / "pvegate" / "site" / "site.rego").write_text("package pvegate.site\n\nx := 1\n")


def test_a_clean_tree_is_clean_beside_ignored_files_the_bundle_does_not_carry(repo: Path, tmp_path: Path) -> None:
    (repo / "policies" / "__pycache__").mkdir()
    (repo / "policies" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert _dirty(repo, tmp_path) is False


def test_an_ignored_policy_file_the_bundle_carries_is_dirty(repo: Path, tmp_path: Path) -> None:
    _site_rule(repo)
    assert _dirty(repo, tmp_path) is True


def test_an_untracked_file_is_dirty_whatever_status_shows_by_default(repo: Path, tmp_path: Path) -> None:
    _git(repo, "config", "status.showUntrackedFiles", "no")
    (repo / "policies" / "pvegate" / "extra.rego").write_text("package pvegate.extra\n\nx := 1\n")
    assert _dirty(repo, tmp_path) is True


def test_a_status_git_cannot_give_is_dirty(repo: Path, tmp_path: Path) -> None:
    (repo / ".git" / "index").write_bytes(b"not an index")  # rev-parse HEAD still answers
    assert _dirty(repo, tmp_path) is True
