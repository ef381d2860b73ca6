"""The policy directory partially evaluated with its data known (`opa build -O=1`).

OPA keeps no rule results across queries: every decision re-derives whatever depends on
data only. The policy keeps that part small by looking the call up in indexes of its data
(bindings by subject, group and token role; role selectors, quotas, approval rules and deny
rules by effect and principal kind: `binding_index`, `selector_index`, ...), and
`opa build -O=1` evaluates those indexes (and everything else that depends on data only)
once, with the data as it is, into constants, leaving the rules over `input`. The managed
sidecar loads this build instead of the plain directory (docs/performance.md has the
figures). The authored policy and data are unchanged; the build lives in a private
temporary directory of the gateway process, one per distinct content of the policy files.

The answers are the same by construction, and tested: tests/policy/test_optimized.py
builds it here and compares it with the plain policy on every golden case, listings and
approver votes, with valid and with broken data. A build failure (a policy tree of one's
own that the optimiser cannot handle) falls back to the plain directory with a warning:
slower, never different. Bundles are loaded as built: `pvegate bundle build` builds them
partially evaluated the same way, with these entrypoints (gateway/policy/bundles.py), unless
asked for `--plain`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from gateway.core import usercache
from gateway.policy.revision import content_digest, policy_files

log = logging.getLogger("pvegate.opa")

# The entrypoints on the hot path (OPA itself asks system.log.mask per logged decision).
# data.pvegate.approver.decision (once per approval vote) is left to the plain modules, which
# the optimised bundle keeps: OPA 1.22's optimiser runs once per entrypoint and names its
# support rules per run (`__not3_0_4__`), and optimising it beside data.pvegate.decision made
# the names collide, so that one of the two answered wrong whatever the order. The
# differential test (tests/policy/test_optimized.py) catches such a collision.
ENTRYPOINTS = (
    "pvegate/decision",
    "pvegate/data_check",
    "pvegate/visible_tools",
    "system/log/mask",
)
# what OPA does not load from a policy directory (as the sidecar's --ignore)
IGNORED = ("*_test.rego", "golden", ".*")
BUILD_TIMEOUT = 60.0


class OptimizeError(Exception):
    """opa build -O=1 failed; the message says why."""


def build_command(opa: Path, policies: tuple[Path, ...], out: Path) -> list[str]:
    cmd = [str(opa), "build", "-O=1"]
    for e in ENTRYPOINTS:
        cmd += ["-e", e]
    for pattern in IGNORED:
        cmd += ["--ignore", pattern]
    return [*cmd, "-o", str(out), *(str(p) for p in policies)]


def build(opa: Path, policies: tuple[Path, ...], dest: Path) -> Path:
    """Build the optimised policy into dest (a directory OPA loads as plain files); returns dest.

    Raises OptimizeError when OPA cannot build it."""
    dest.mkdir(parents=True, exist_ok=True)
    tarball = dest.parent / f"{dest.name}.tar.gz"
    try:
        done = subprocess.run(
            build_command(opa, policies, tarball), capture_output=True, text=True, timeout=BUILD_TIMEOUT
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OptimizeError(f"opa build -O=1 did not run: {exc}") from exc
    if done.returncode != 0:
        raise OptimizeError(f"opa build -O=1 failed: {(done.stderr or done.stdout).strip()[:2000]}")
    try:
        with tarfile.open(tarball) as tar:
            # OPA wrote it a moment ago into our private directory; the filter still refuses
            # anything that would land outside dest
            tar.extractall(dest, filter="data")
    except (OSError, tarfile.TarError) as exc:
        raise OptimizeError(f"cannot unpack the optimised bundle: {exc}") from exc
    finally:
        tarball.unlink(missing_ok=True)
    # the manifest names the bundle's roots; loaded as plain files, OPA does not need it
    (dest / ".manifest").unlink(missing_ok=True)
    return dest


# Builds by content: tests and a restarting sidecar load the same tree many times, and a build
# costs OPA ~0.4 s of CPU. Kept in this process and in the user's cache directory
# ($XDG_CACHE_HOME/pvegate/opa-optimized, used only when this user owns it and nobody else
# may write to it: a build where others could write would be a way to plant a policy).
_cache: dict[str, Path] = {}
_cache_lock = threading.Lock()
_tmp_root: Path | None = None


def _key(opa: Path, policies: tuple[Path, ...]) -> str:
    # the binary by path and by what is there now: an OPA upgraded in place (its partial evaluation may
    # differ) builds anew rather than serve the old binary's output
    st = opa.resolve().stat()
    # (ctime too: an overwrite in place that keeps size and mtime, `cp -p`, still changes it)
    binary = f"{opa.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
    h = hashlib.sha256(binary.encode() + b"\0" + ",".join(ENTRYPOINTS).encode())
    for p in policies:
        files = policy_files(p) if p.is_dir() else [p]
        digest = content_digest(files, p if p.is_dir() else p.parent)
        h.update(b"\0" + digest.encode())  # not the path: copies of one tree share a build
    return h.hexdigest()


def _cache_root() -> Path:
    """The user's cache directory for builds, or this process's own temporary one."""
    global _tmp_root
    if (base := usercache.private_dir("opa-optimized")) is not None:
        return base
    if _tmp_root is None:
        _tmp_root = Path(tempfile.mkdtemp(prefix="pvegate-optimized-"))
        atexit.register(shutil.rmtree, _tmp_root, True)
    return _tmp_root


CACHE_KEEP = 32  # builds kept on disk, the most recently used


def _prune(root: Path) -> None:
    """Remove all but the CACHE_KEEP most recently used builds (a process using one keeps its files
    open only while OPA loads them: OPA holds the policy in memory once started)."""
    builds = []
    for d in root.iterdir():
        with contextlib.suppress(OSError):
            if not d.name.startswith("."):
                builds.append(((d / ".done").stat().st_mtime, d))
    for _, d in sorted(builds, reverse=True)[CACHE_KEEP:]:
        shutil.rmtree(d, ignore_errors=True)


def build_cached(opa: Path, policies: tuple[Path, ...]) -> Path:
    """build(), reused while the policy files and the OPA binary (its path, size and modification time) are
    the same."""
    key = _key(opa, policies)
    with _cache_lock:
        if key in _cache and _cache[key].is_dir():
            return _cache[key]
        root = _cache_root()
        final = root / key[:32]
        if not (final / ".done").exists():
            staging = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
            try:
                built = build(opa, policies, staging / "policy")
            except OptimizeError:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            (built / ".done").touch()  # OPA ignores dotfiles (--ignore .*)
            if _key(opa, policies) != key:  # the files changed while it built: use it this once
                return built
            with contextlib.suppress(OSError):  # another process completed the same build first
                os.rename(built, final)
            shutil.rmtree(staging, ignore_errors=True)
            _prune(root)
        with contextlib.suppress(OSError):
            (final / ".done").touch()  # recently used: kept by _prune
        if not (final / ".done").exists():
            raise OptimizeError(f"no complete build at {final}")
        _cache[key] = final
        return final
