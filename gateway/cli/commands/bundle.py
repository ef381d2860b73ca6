"""`pvegate bundle keygen|build|verify`: signed OPA bundles from policies/."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.policy.bundles import BundleError, SignatureRefused, build, built_optimized, keygen, verify_signature
from gateway.policy.catalog_refs import CONNECTORS_ENV
from gateway.policy.opa_sidecar import REPO_ROOT, OPAUnavailable


def _revision(text: str) -> str:
    """An argparse type: a revision that is not blank (a usage error otherwise, exit 2): a blank one
    would be recorded as it is, or an empty one silently replaced by the derived revision."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"a blank revision: {text!r} (omit --revision for the derived one)")
    return text


def _key_dir(text: str) -> Path:
    """An argparse type: a directory path that is not blank (a usage error otherwise, exit 2): an empty
    one is the current directory to Path, and the key pair would land there unasked."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"a blank directory: {text!r} (omit --out for the default, or give . for the current directory)"
        )
    return Path(text)


def _keygen(args: argparse.Namespace) -> int:
    out: Path = args.out
    if out.exists() and not out.is_dir():  # --force replaces a key pair, never a file named as the directory
        print(
            f"error: --out {out} is a file, not a directory: the key pair is written into a directory "
            "(keygen never replaces a file)",
            file=sys.stderr,
        )
        return 1
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way above it, no permission: said without the raw [Errno N]
        print(f"error: cannot create the directory {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        priv, pub = keygen(out, force=args.force)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write the key pair in {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"signing key (keep secret): {priv}\nverification key: {pub}")
    return 0


def _build(args: argparse.Namespace) -> int:
    try:
        rev = build(
            args.policies,
            args.output,
            args.signing_key,
            args.revision,
            unsigned=args.unsigned,
            optimize=not args.plain,
            connectors=args.connectors,
        )
    except (BundleError, OPAUnavailable, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot build {args.output}: {exc}", file=sys.stderr)
        return 1
    print(
        f"built {args.output} (revision {rev}{', signed' if args.signing_key else ', UNSIGNED'}; policy checks passed; "
        f"{'partially evaluated with its data' if built_optimized(args.output) else 'plain'})"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    # Checked here: a missing bundle is no refusal of its signature, and a key file that is missing,
    # unreadable, no PEM public key or a private key is an error of its own (verify_signature says
    # which before OPA is asked: OPA would take an unreadable path for the key's PEM text itself).
    if not args.bundle.exists():
        print(f"error: bundle {args.bundle} not found", file=sys.stderr)
        return 1
    try:
        with tempfile.TemporaryDirectory(prefix="pvegate-verify-") as tmp:  # never beside the bundle
            verify_signature(args.bundle, args.verification_key, Path(tmp) / "verified.tar.gz")
    except SignatureRefused as exc:
        print(f"REFUSED: {exc}", file=sys.stderr)
        return 1
    except (BundleError, OPAUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired:
        print(f"error: opa did not verify {args.bundle} within 120 s", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot verify {args.bundle}: {exc}", file=sys.stderr)
        return 1
    print(f"OK: {args.bundle} is signed by the key {args.verification_key}")
    return 0


def register(sub: Any) -> None:
    b = sub.add_parser("bundle", help="build and sign OPA bundles")
    bsub = b.add_subparsers(dest="bundle_command", required=True)
    k = bsub.add_parser("keygen", help="create an RS256 signing key pair")
    k.add_argument("--out", type=_key_dir, default=REPO_ROOT / "bundles" / "keys", help="directory for the key pair")
    k.add_argument(
        "--force",
        action="store_true",
        help="replace an existing key pair (bundles signed with the old key no longer verify)",
    )
    k.set_defaults(func=_keygen)
    p = bsub.add_parser(
        "build", help="run the policy checks, then build a bundle from policies/ signed with --signing-key"
    )
    p.add_argument("--policies", type=Path, default=REPO_ROOT / "policies", help="the policy directory")
    p.add_argument(
        "--output", "-o", type=Path, default=REPO_ROOT / "bundles" / "pvegate.tar.gz", help="the bundle file to write"
    )
    p.add_argument("--signing-key", type=Path, help="RS256 private key (pvegate bundle keygen); required")
    p.add_argument("--unsigned", action="store_true", help="build without a signature (development only)")
    p.add_argument(
        "--revision", type=_revision, help="the bundle revision OPA reports and the audit records (default: derived)"
    )
    p.add_argument(
        "--connectors",
        type=Path,
        help="the gateway's connector directory: every tool, tool tag and argument the policy data names must be "
        f"in its tool catalog (default: ${CONNECTORS_ENV}, else this installation's connectors/)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="build the policy as written, without partial evaluation (opa build -O=1) with its data",
    )
    p.set_defaults(func=_build)
    v = bsub.add_parser("verify", help="verify a bundle's signature")
    v.add_argument("bundle", type=Path, help="the bundle file")
    v.add_argument("--verification-key", type=Path, required=True, help="public key (PEM)")
    v.set_defaults(func=_verify)
