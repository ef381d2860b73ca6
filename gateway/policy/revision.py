"""What a policy revision is, for a bundle build and for a policy directory OPA loads.

A bundle's revision (`pvegate bundle build`) ends in the content digest of what it
holds; a managed OPA loading a directory has the revision `files:<12 hex>`, the same
kind of digest over the policy files it loaded (a bundle also holds the OPA API guard
the build adds, so the two digests of one tree differ).

The digest covers every file OPA loads from the directory, or the directory is refused: OPA
also loads a bundle archive (`*.tar.gz`) found inside a policy directory, which no revision,
check or optimised build here covers, so `policy_files` refuses a directory holding one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gateway.policy.errors import OPAUnavailable

EXCLUDED = ("_test.rego", "golden", ".regal", ".manifest", "README.md")
POLICY_SUFFIXES = (".rego", ".json", ".yaml", ".yml")
DATA_SUFFIXES = (".json", ".yaml", ".yml")
# the only data files OPA's bundle reader loads (any other .json/.yaml in a bundle is skipped
# without a word; patch.json would even make it a delta bundle), while a policy directory
# loaded as files gives every .json/.yaml to the data at its directory's path
BUNDLE_DATA_NAMES = ("data.json", "data.yaml", "data.yml")
ARCHIVE_SUFFIX = ".tar.gz"  # OPA loads it from a policy directory as a bundle


def _ignored(rel: Path) -> bool:
    """Left out of a policy directory, as OPA's `--ignore *_test.rego golden .*` leaves it out."""
    return any(part in EXCLUDED or part.startswith(".") for part in rel.parts) or rel.name.endswith("_test.rego")


def _included(path: Path, root: Path) -> bool:
    return not _ignored(path.relative_to(root)) and path.suffix in POLICY_SUFFIXES


def policy_files(policies: Path) -> list[Path]:
    """The files of a policy directory that are policy (tests, golden cases, dotfiles left out).

    Refuses (OPAUnavailable) a directory holding a bundle archive: OPA would load it as well,
    and nothing that identifies or checks the policy (this list, so the `files:` revision, the
    data checks, the optimised build's cache key, a bundle build) would see it."""
    files: list[Path] = []
    for p in sorted(policies.rglob("*")):
        if not p.is_file() or _ignored(p.relative_to(policies)):
            continue
        if p.name.endswith(ARCHIVE_SUFFIX):
            raise OPAUnavailable(
                f"{p}: a bundle archive inside a policy directory: OPA would load it too, but the policy "
                "revision and the policy checks do not cover it; give a bundle as opa.bundle (or unpack "
                "its policy files into the directory), and keep built bundles outside policy directories"
            )
        if p.suffix in POLICY_SUFFIXES:
            files.append(p)
    return files


def not_in_bundle(files: list[Path]) -> list[Path]:
    """The data files (of `files`) OPA's bundle reader would not load: any .json/.yaml
    not named data.json/data.yaml/data.yml. Loaded as a directory, OPA gives them to the data at
    their directory's path; built into a bundle, they would be carried, counted in its revision and
    ignored."""
    return [f for f in files if f.suffix in DATA_SUFFIXES and f.name not in BUNDLE_DATA_NAMES]


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
