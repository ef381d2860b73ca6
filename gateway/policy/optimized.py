"""The policy partially evaluated with its data known (`opa build -O=1`).

`opa build -O=1` evaluates what depends on data only once, at build time, and keeps the
rules over `input`. The repository's policy must build this way, with the same answers as
the plain policy: tests/policy/test_optimized.py builds it here and compares both on every
golden case, listings and approver votes, with valid and with broken data. (Measured on
the golden read it saves ~11 % of the allocations per decision: the policy's cost is in
functions over input, which partial evaluation keeps; docs/performance.md. So the managed
sidecar loads the plain directory.)
"""

from __future__ import annotations

import logging
import subprocess
import tarfile
from pathlib import Path

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
