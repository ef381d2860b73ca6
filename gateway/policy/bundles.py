"""Signed OPA bundles built from policies/: checks, staging, manifest, `opa build`, keys.

A tree is only built after it passes every policy check (`scripts/policy-checks.sh`:
opa check --strict, opa fmt, opa test with the coverage threshold, Regal, and `pvegate policy
check`: the data against its schema and against the tool catalog of the gateway's connector
directory, which the checks get as $PVEGATE_CONNECTORS), and only
signed, unless the caller says `unsigned` out loud. The tree is read once: copied whole into a
private directory first, the checks run on that copy and the bundle is built from it, so what is
signed is exactly what was checked (an edit made while the checks run is in neither). A checked
tree must also define `data.system.log.mask` holding "/input/arguments" (policies/system/log/
log.rego), as a managed OPA with decision logs requires. Test files and golden cases stay
out of production bundles. The revision is the git commit plus a digest of the
bundle's content, so two builds of the same policies carry the same revision and any
change is visible in every decision's provenance; the manifest also names the full
commit the tree was built from.

Every bundle also carries `system.authz` (gateway/policy/opa_authz/), the policy that lets
only the holder of OPA's API token use OPA's REST API: a managed or container OPA
loading the bundle runs with `--authentication=token --authorization=basic`, and
the guard is signed with the rest.

A bundle is built partially evaluated with its data (`opa build -O=1` on the entrypoints of
gateway/policy/optimized.py, as the managed sidecar loads a policy directory): the policy's
data indexes become constants, so a decision costs OPA under half the CPU of the plain
bundle's (docs/performance.md), with the same answers (tests/policy/test_optimized.py). The
authored modules travel with it, unchanged, for the rules no entrypoint covers (approver
votes, the console). `optimized: true|false` in the manifest's metadata says which it is; a
tree the optimiser cannot build is built plain, with a warning, and `--plain` asks for that.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.core import yamlread
from gateway.core.keys import verification_key_problem as verification_key_problem  # re-exported for its callers
from gateway.policy.catalog_refs import CONNECTORS_ENV
from gateway.policy.opa_sidecar import (
    AUTHZ_POLICY,
    MASKED_PATH,
    REPO_ROOT,
    OPAUnavailable,
    find_opa,
    masks_arguments,
)
from gateway.policy.optimized import ENTRYPOINTS
from gateway.policy.revision import DATA_SUFFIXES, content_digest, not_in_bundle, policy_files

CHECKS_SCRIPT = REPO_ROOT / "scripts" / "policy-checks.sh"

log = logging.getLogger("pvegate.bundle")


class BundleError(Exception):
    pass


class SignatureRefused(BundleError):
    """OPA refused a bundle's signature (wrong key, changed after signing, unsigned): its reason."""


def verify_signature(bundle: Path, key: Path, output: Path, timeout: float = 120) -> None:
    """Verify a bundle's signature with OPA: `opa build -b <bundle> --verification-key <key>` verifies
    the signatures of its input before re-packaging it into `output` (a path in a directory of the
    caller's own, never beside the bundle); the verified copy holds the bundle's files, unsigned.

    Raises BundleError for a key that is no public key (verification_key_problem), SignatureRefused
    with OPA's reason, OPAUnavailable without opa, subprocess.TimeoutExpired."""
    problem = verification_key_problem(key)
    if problem is not None:
        raise BundleError(problem)
    cmd = [str(find_opa()), "build", "-b", str(bundle), "--verification-key", str(key), "-o", str(output)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SignatureRefused(done.stderr.strip() or done.stdout.strip())


def _read_files(bundle: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(name without a leading /, content) of the files of a bundle tarball whose name is `wanted`."""
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            name = m.name.lstrip("/")
            if m.isfile() and wanted(name):
                f = tar.extractfile(m)
                if f is not None:
                    yield name, f.read()


def wasm_modules(bundle: Path) -> list[str]:
    """The Wasm modules a bundle (tarball or directory) carries: OPA evaluates its entrypoints with
    them instead of the Rego beside them, and `opa check` cannot see what a module calls."""
    if bundle.is_dir():
        return sorted(str(f.relative_to(bundle)) for f in bundle.rglob("*.wasm"))
    return sorted(name for name, _ in _read_files(bundle, lambda n: n.endswith(".wasm")))


def bundle_has_authz(bundle: Path) -> bool:
    """Whether a bundle (tarball or directory) declares `package system.authz`: the API guard an
    external OPA needs (docs/opa.md)."""

    def declares(text: str) -> bool:
        return any(line.strip() == "package system.authz" for line in text.splitlines())

    try:
        if bundle.is_dir():
            return any(declares(f.read_text(errors="replace")) for f in bundle.rglob("*.rego"))
        return any(
            declares(text.decode(errors="replace")) for _, text in _read_files(bundle, lambda n: n.endswith(".rego"))
        )
    except (OSError, tarfile.TarError):
        return True  # unreadable: let OPA say why it cannot load it
    return False


def _git(where: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def git_source(policies: Path, carried: Iterable[Path] = ()) -> dict[str, object] | None:
    """The commit the policy tree is at, and whether the tree differs from it; None outside git.
    `carried`: the files (relative to `policies`) the bundle holds."""
    commit = _git(policies, "rev-parse", "HEAD")
    if commit is None:
        return None
    return {"commit": commit, "dirty": _dirty(policies, set(carried))}


def _dirty(policies: Path, carried: set[Path]) -> bool:
    """Whether the tree differs from its commit in anything, or the bundle carries a file git ignores
    (no commit holds it, yet the manifest's git_commit would vouch for it). True when git cannot say:
    an unknown state is never reported clean. Untracked files are listed whatever status.showUntrackedFiles
    says."""
    cmd = ["git", "-C", str(policies), "status", "--porcelain", "-z", "--ignored", "--untracked-files=all"]
    try:
        done = subprocess.run([*cmd, "--", "."], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    prefix = _git(policies, "rev-parse", "--show-prefix") or ""  # (paths are from the repository's top)
    if done.returncode != 0:
        return True
    entries = iter(done.stdout.split(b"\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        status, path = entry[:2], os.fsdecode(entry[3:])
        if b"R" in status or b"C" in status:
            next(entries, None)  # a rename's or copy's source path follows
        if status != b"!!":
            return True
        if Path(path.removeprefix(prefix)) in carried:  # an ignored file the bundle holds
            return True
    return False


def run_checks(policies: Path, connectors: Path | None = None) -> tuple[bool, str]:
    """All policy checks on the tree (the one implementation: scripts/policy-checks.sh); the data's
    tool, tool tag and argument names against the tool catalog of `connectors` (default: the one
    `pvegate policy check` takes by default)."""
    env = dict(os.environ, OPA=str(find_opa()))
    env.setdefault("PYTHON", sys.executable)  # the script's data check runs in this environment, wherever it is
    if connectors is not None:
        env[CONNECTORS_ENV] = str(connectors.resolve())
    try:
        done = subprocess.run(
            ["bash", str(CHECKS_SCRIPT), str(policies.resolve())],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=REPO_ROOT,
        )
    except subprocess.TimeoutExpired:
        return False, "policy checks did not finish within 600 s"
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def roots_of(files: list[Path], root: Path) -> list[str]:
    """Bundle roots: each Rego package's first segment (system.log stays narrow), each data dir
    (a data file at the top of the tree: each of its top-level keys). `files` are what the bundle
    loads: the data files among them are named data.json / data.yaml / data.yml (build())."""
    roots: set[str] = set()
    for f in files:
        if f.suffix == ".rego":
            for line in f.read_text().splitlines():
                if line.startswith("package "):
                    parts = line.split()[1].split(".")
                    roots.add("/".join(parts[:2]) if parts[0] == "system" else parts[0])
                    break
        elif f.suffix in DATA_SUFFIXES:
            rel = f.relative_to(root)
            if len(rel.parts) > 1:
                roots.add(rel.parts[0])
                continue
            try:  # (a JSON document is YAML too)
                doc = yamlread.load(f.read_text())
            except (OSError, ValueError, yaml.YAMLError, RecursionError):
                continue  # opa build says what is wrong with it
            if isinstance(doc, dict):
                roots.update(str(k) for k in doc)
    return sorted(roots)


KEY_FILES = ("bundle-signing.pem", "bundle-verify.pem")


def keygen(directory: Path, *, force: bool = False) -> tuple[Path, Path]:
    """An RSA key pair for RS256 bundle signing (private key 0600).

    Never overwrites a pair (a lost signing key strands every bundle signed with it) unless
    `force`; the files are created with O_EXCL, so the private key is 0600 from its first byte
    and a link planted at either path is refused rather than followed.
    """
    directory.mkdir(parents=True, exist_ok=True)
    priv, pub = (directory / name for name in KEY_FILES)
    for path in (priv, pub):
        if not force and (path.exists() or path.is_symlink()):  # (a dangling link: exists() says no)
            raise BundleError(f"{path} already exists: give --force to replace the key pair")
    key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    if force:  # removed, not truncated: the new files are created afresh, mode included
        for path in (priv, pub):
            path.unlink(missing_ok=True)
    written: list[Path] = []
    try:
        for path, data, mode in ((priv, pem, 0o600), (pub, public, 0o644)):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode)
            except FileExistsError:  # created since the check above
                raise BundleError(f"{path} already exists: give --force to replace the key pair") from None
            written.append(path)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
    except BaseException:
        for path in written:  # no half pair left behind
            path.unlink(missing_ok=True)
        raise
    return priv, pub


AUTHZ_IN_BUNDLE = Path("system") / "authz" / "authz.rego"


def _declares_authz(files: list[Path]) -> bool:
    return any(
        f.suffix == ".rego" and any(line.strip() == "package system.authz" for line in f.read_text().splitlines())
        for f in files
    )


def _link_problem(policies: Path) -> str | None:
    """Why a link in the policy tree must not be followed into a bundle, or None. A link that leads
    out of the tree would have the bundle sign content no commit of the policy repository holds
    (its manifest's git_commit and git_dirty vouching for it all the same); one that leads nowhere
    would be left out of the copy; one back to a directory the walk came through (directly, or by
    two links that lead to each other) would make the copy never end."""
    root = policies.resolve()
    for here, dirs, names in os.walk(policies, followlinks=True):  # as the copy goes: through links
        dirs[:] = [d for d in dirs if d != ".git"]  # (as the copy leaves it out)
        at = Path(here)
        parts = at.relative_to(policies).parts
        came_through = {(policies.joinpath(*parts[:i])).resolve() for i in range(len(parts))}
        if at.resolve() in came_through:
            return f"{at} leads back to {at.resolve()}, a directory it is reached through (a loop of links)"
        for name in [*dirs, *names]:
            path = at / name
            if not path.is_symlink():
                continue
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError):  # dangling, or a link to itself
                return f"{path} is a link that leads nowhere"
            if not target.is_relative_to(root):
                return f"{path} is a link to {target}, outside the policy directory {policies}"
            if target.is_relative_to(root / ".git"):
                return f"{path} is a link into {root / '.git'}, which no bundle holds"
    return None


def _snapshot(policies: Path, dest: Path) -> Path:
    """A copy of the whole policy tree (links within it followed: the copy holds what they point
    at), made before anything of it is checked; a git directory inside it is left out. A link out
    of the tree, or to nothing, is refused (_link_problem)."""
    if (problem := _link_problem(policies)) is not None:
        raise BundleError(f"{problem}: a bundle holds only what is in its policy tree; nothing was built")
    try:
        # every link was checked above (in the tree, leads somewhere, no loop): one the copy found dangling
        # after all (shutil reads a relative link's target from the working directory, not the link's) is
        # an error here, never a file silently left out
        shutil.copytree(policies, dest, ignore=shutil.ignore_patterns(".git"))
    except (OSError, shutil.Error) as exc:
        raise BundleError(f"cannot copy the policy tree {policies}: {exc}") from None
    return dest


def _bundle_files(tree: Path, policies: Path) -> list[Path]:
    """The policy files of the copied `tree` a bundle carries; BundleError (naming them as in
    `policies`, the caller's tree) for a tree a bundle cannot be built from."""
    try:
        files = policy_files(tree)
    except OPAUnavailable as exc:  # a bundle archive inside the tree
        raise BundleError(str(exc).replace(str(tree), str(policies))) from None
    if not any(p.suffix == ".rego" for p in files):
        raise BundleError(f"no Rego policies under {policies}")
    if ignored := not_in_bundle(files):
        # loaded as a directory (the checks, a managed OPA) OPA reads them; from a bundle it would not
        names = ", ".join(str(policies / f.relative_to(tree)) for f in ignored)
        raise BundleError(
            f"OPA's bundle format loads only data files named data.json, data.yaml or data.yml, so a "
            f"bundle would carry but never load {names}: name each data file data.yaml (or data.json) in "
            "its own directory, e.g. merge it into the data.yaml beside it (a policy directory loaded as "
            "files puts every data file at its directory's path); nothing was built"
        )
    return files


def log_mask_problem(tree: Path, timeout: float = 120) -> str | None:
    """Why the policy of `tree` would let decision logs hold the tool arguments, or None: its
    `data.system.log.mask` (package system.log, rule mask) must hold "/input/arguments"
    (policies/system/log/log.rego). Evaluated by OPA on the tree as a bundle would load it."""
    cmd = [str(find_opa()), "eval", "-f", "json", "-d", str(tree), "data.system.log.mask"]
    cmd += ["--ignore", "*_test.rego", "--ignore", "golden", "--ignore", ".*"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        return f"cannot evaluate data.system.log.mask: {(done.stderr or done.stdout).strip()[:500]}"
    try:
        value = json.loads(done.stdout)["result"][0]["expressions"][0]["value"]
    except (ValueError, KeyError, IndexError, TypeError):
        value = None  # undefined: no such rule
    if masks_arguments(value):
        return None
    return (
        f'the policy\'s data.system.log.mask (package system.log, rule mask) does not hold "{MASKED_PATH}" '
        "(policies/system/log/log.rego): with decision logs on, OPA would log every call's tool arguments, "
        "passwords included, and the gateway refuses to start on it"
    )


def signing_key_problem(key: Path) -> str | None:
    """Why the file `key` cannot sign a bundle (`opa build --signing-alg RS256`), or None: it must be an
    unencrypted PEM RSA private key (`pvegate bundle keygen`'s bundle-signing.pem). Said before the
    checks run: OPA finds out only when it signs, and its first refusal read as the optimiser's
    failure. Never quotes the file's content."""
    try:
        pem = key.read_bytes()
    except FileNotFoundError:
        return f"signing key {key} not found"
    except IsADirectoryError:
        return f"signing key {key} is a directory, not a key file"
    except OSError as exc:
        return f"cannot read the signing key {key}: {exc.strerror or exc}"
    if b"PUBLIC KEY-----" in pem and b"PRIVATE KEY-----" not in pem:
        return (
            f"signing key {key} is a public (verification) key: give the private key that signs "
            "(bundle-signing.pem of `pvegate bundle keygen`)"
        )
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except TypeError:  # encrypted: OPA takes no passphrase
        return f"signing key {key} is encrypted with a passphrase, which OPA cannot use: give it unencrypted"
    except (ValueError, UnsupportedAlgorithm):
        return f"signing key {key} is not a PEM private key"
    if not isinstance(private, rsa.RSAPrivateKey):
        return f"signing key {key} is not an RSA private key: bundles are signed RS256"
    return None


def build(
    policies: Path,
    output: Path,
    signing_key: Path | None,
    revision: str | None = None,
    *,
    unsigned: bool = False,
    checks: bool = True,
    optimize: bool = True,
    connectors: Path | None = None,
) -> str:
    """Check, build and sign a bundle from a policy directory; returns the revision.

    Refuses (BundleError) without a signing key unless `unsigned`, and when any policy
    check fails. `checks=False` is for tests that build many variants of an already
    checked tree; the CLI always checks. `optimize` builds it partially evaluated (the module
    docstring), falling back to a plain build when OPA cannot. `connectors`: the connector
    directory whose tool catalog the checks hold the data's tool and argument names against.
    """
    if signing_key is None and not unsigned:
        raise BundleError("no --signing-key given: a bundle is signed unless --unsigned is given explicitly")
    if signing_key is not None and (problem := signing_key_problem(signing_key)) is not None:
        raise BundleError(f"{problem}; nothing was built")  # said before minutes of checks
    if not policies.is_dir():
        raise BundleError(f"no policy directory {policies}")
    if output.resolve().is_relative_to(policies.resolve()):
        # a bundle archive inside the tree is refused by every later build and by OPA loading the tree
        raise BundleError(
            f"the bundle {output} would be written inside the policy directory {policies}, where OPA would load "
            "it as policy; write it elsewhere (the default is bundles/pvegate.tar.gz); nothing was built"
        )
    if checks and connectors is not None and not connectors.is_dir():  # said before minutes of checks
        raise BundleError(f"no connector directory {connectors}; nothing was built")
    with tempfile.TemporaryDirectory(prefix="pvegate-bundle-") as tmp:
        # The tree is read once, here: the checks run on this copy and the bundle is built from it,
        # so what is signed is exactly what was checked (an edit of the tree made while the checks
        # run is in neither). The whole tree: the checks need its tests, golden cases and lint config.
        tree = _snapshot(policies, Path(tmp) / "policies")
        files = _bundle_files(tree, policies)
        # asked after the copy: an edit made since shows as dirty, never a changed copy as clean
        source = git_source(policies, [f.relative_to(tree) for f in files])
        short = str(source["commit"])[:12] if source else "nogit"
        if checks:
            ok, report = run_checks(tree, connectors)
            report = report.replace(str(tree.resolve()), str(policies))  # name the tree the caller gave
            if not ok:
                summary = [ln for ln in report.splitlines() if ln.startswith("policy checks FAILED")]
                head = summary[-1].removeprefix("policy checks ") if summary else "FAILED"
                raise BundleError(f"policy checks {head}; nothing was built\n\n{report}")
            if (problem := log_mask_problem(tree)) is not None:
                raise BundleError(f"{problem}; nothing was built")
        stage = Path(tmp) / "bundle"
        for f in files:
            dest = stage / f.relative_to(tree)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        if not _declares_authz(files):  # a policy directory may bring its own API guard; else ours
            (stage / AUTHZ_IN_BUNDLE).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(AUTHZ_POLICY, stage / AUTHZ_IN_BUNDLE)
        staged = [p for p in stage.rglob("*") if p.is_file()]
        revision = revision or f"{short}-{content_digest(staged, stage)[:12]}"
        metadata: dict[str, object] = {
            "source": "pvegate",
            # to the microsecond: PolicyStatus orders activations by it (a rollback is reported)
            "built_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        if source is not None:
            metadata["git_commit"] = source["commit"]
            metadata["git_dirty"] = source["dirty"]
        metadata["checked"] = checks
        manifest = {"revision": revision, "roots": roots_of(staged, stage), "metadata": metadata}
        output.parent.mkdir(parents=True, exist_ok=True)
        done = _opa_build(stage, output, signing_key, manifest, optimize)
        if done.returncode != 0 and optimize:
            log.warning(
                "opa build -O=1 failed; building the bundle plain (slower, the same answers): %s",
                (done.stderr or done.stdout).strip()[:2000],
            )
            done = _opa_build(stage, output, signing_key, manifest, False)
        if done.returncode != 0:
            raise BundleError(f"opa build failed: {done.stderr.strip() or done.stdout.strip()}")
    return revision


def _opa_build(
    stage: Path,
    output: Path,
    signing_key: Path | None,
    manifest: dict[str, Any],
    optimize: bool,
) -> subprocess.CompletedProcess[str]:
    metadata = {**manifest["metadata"], "optimized": optimize}
    (stage / ".manifest").write_text(json.dumps({**manifest, "metadata": metadata}))
    cmd = [str(find_opa()), "build", "-b", ".", "-o", str(output.resolve())]
    if optimize:
        # (-O=1 writes a manifest of its own: the revision is given again, or it would be lost)
        cmd += ["-O=1", "--revision", str(manifest["revision"])]
        for e in ENTRYPOINTS:
            cmd += ["-e", e]
    if signing_key is not None:
        cmd += ["--signing-key", str(signing_key.resolve()), "--signing-alg", "RS256"]
    # paths in the bundle stay relative
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=stage)


def built_optimized(bundle: Path) -> bool:
    """Whether a bundle tarball was built partially evaluated (`optimized` in its manifest's metadata)."""
    meta = manifest_of(bundle).get("metadata")
    return isinstance(meta, dict) and meta.get("optimized") is True


def manifest_of(bundle: Path) -> dict[str, object]:
    """A bundle tarball's manifest ({} when it has none)."""
    for _, text in _read_files(bundle, lambda n: n == ".manifest"):
        doc = json.loads(text)
        return doc if isinstance(doc, dict) else {}
    return {}
