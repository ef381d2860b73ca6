"""What a policy revision is, for a bundle build and for a policy directory OPA loads.

A bundle's revision (`pvegate bundle build`) ends in the content digest of what it
holds; a managed OPA loading a directory has the revision `files:<12 hex>`, the same
kind of digest over the policy files it loaded (a bundle also holds the OPA API guard
the build adds, so the two digests of one tree differ).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

EXCLUDED = ("_test.rego", "golden", ".regal", ".manifest", "README.md")


def _included(path: Path, root: Path) -> bool:
    rel = path.relative_to(root)
    if any(part in EXCLUDED or part.startswith(".") for part in rel.parts):
        return False
    return path.suffix in (".rego", ".json", ".yaml", ".yml") and not path.name.endswith("_test.rego")


def policy_files(policies: Path) -> list[Path]:
    """The files of a policy directory that are policy (tests, golden cases, dotfiles left out)."""
    return [p for p in policies.rglob("*") if p.is_file() and _included(p, policies)]


def content_digest(files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def files_revision(directories: tuple[Path, ...]) -> str:
    """`files:<12 hex>`: the SHA-256 over the policy files OPA loads from these directories
    (paths and contents, as `content_digest`)."""
    digests = [
        content_digest(policy_files(d), d) if d.is_dir() else content_digest([d], d.parent)
        for d in directories
        if d.exists()
    ]
    digest = digests[0] if len(digests) == 1 else hashlib.sha256("".join(digests).encode()).hexdigest()
    return "files:" + digest[:12]
