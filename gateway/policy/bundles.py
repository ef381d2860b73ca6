"""Signed OPA bundles built from policies/: staging, manifest, `opa build`, keys.

Test files and golden cases stay out of production bundles. The revision is the
git commit plus a digest of the bundle's content, so two builds of the same
policies carry the same revision and any change is visible in every decision's
provenance.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.policy.opa_sidecar import REPO_ROOT, find_opa

EXCLUDED = ("_test.rego", "golden", ".regal", ".manifest", "README.md")


class BundleError(Exception):
    pass


def _included(path: Path, root: Path) -> bool:
    rel = path.relative_to(root)
    if any(part in EXCLUDED or part.startswith(".") for part in rel.parts):
        return False
    return path.suffix in (".rego", ".json", ".yaml", ".yml") and not path.name.endswith("_test.rego")


def content_digest(files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def roots_of(files: list[Path], root: Path) -> list[str]:
    """Bundle roots: each Rego package's first segment (system.log stays narrow), each data dir."""
    roots: set[str] = set()
    for f in files:
        if f.suffix == ".rego":
            for line in f.read_text().splitlines():
                if line.startswith("package "):
                    parts = line.split()[1].split(".")
                    roots.add("/".join(parts[:2]) if parts[0] == "system" else parts[0])
                    break
        else:
            roots.add(f.relative_to(root).parts[0])
    return sorted(roots)


def keygen(directory: Path) -> tuple[Path, Path]:
    """An RSA key pair for RS256 bundle signing (private key 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    priv, pub = directory / "bundle-signing.pem", directory / "bundle-verify.pem"
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    priv.chmod(0o600)
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


def build(policies: Path, output: Path, signing_key: Path | None, revision: str | None = None) -> str:
    """Build (and sign) a bundle from a policy directory; returns the revision."""
    files = [p for p in policies.rglob("*") if p.is_file() and _included(p, policies)]
    if not any(p.suffix == ".rego" for p in files):
        raise BundleError(f"no Rego policies under {policies}")
    revision = revision or f"{_git_commit() or 'nogit'}-{content_digest(files, policies)[:12]}"
    with tempfile.TemporaryDirectory(prefix="pvegate-bundle-") as tmp:
        stage = Path(tmp) / "bundle"
        for f in files:
            dest = stage / f.relative_to(policies)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        manifest = {"revision": revision, "roots": roots_of(files, policies), "metadata": {"source": "pvegate"}}
        (stage / ".manifest").write_text(json.dumps(manifest))
        cmd = [str(find_opa()), "build", "-b", ".", "-o", str(output.resolve())]
        if signing_key is not None:
            cmd += ["--signing-key", str(signing_key.resolve()), "--signing-alg", "RS256"]
        output.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, cwd=stage
        )  # paths in the bundle stay relative
        if done.returncode != 0:
            raise BundleError(f"opa build failed: {done.stderr.strip() or done.stdout.strip()}")
    return revision
