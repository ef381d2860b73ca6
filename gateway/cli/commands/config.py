"""`pvegate config`: check a configuration file without starting anything; print the settings reference."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gateway.core.config import Config, ConfigError, load


def _check(args: argparse.Namespace) -> int:
    from gateway.cli import config_problems

    try:
        config = load(args.file)
    except ConfigError as exc:  # the file's problems are this command's finding: exit 1 (not 2, "cannot run")
        for line in config_problems(exc):
            print(line, file=sys.stderr)
        return 1
    if args.files:
        # serve's own read-only start checks (gateway/server.py), so the two cannot disagree; then the
        # secrets and the directories serve writes, checked here without creating anything
        from gateway.server import (
            StartupError,
            check_files,
            check_secret_strength,
            check_ssh_keys,
            check_tls,
            secret_refs,
        )

        found: list[str] = []
        try:
            check_files(config)
            check_ssh_keys(config)
            check_tls(config)
        except StartupError as exc:
            found.append(str(exc))
        missing = [p for ref in secret_refs(config) if (p := ref.unavailable()) is not None]
        found += missing
        if not missing:  # all there: long enough as serve's start requires (a short key refuses it)
            try:
                check_secret_strength(config)
            except StartupError as exc:
                found.append(str(exc))
        found += _write_dir_problems(config)
        for line in dict.fromkeys(w for ref in secret_refs(config) if (w := ref.exposed()) is not None):
            print(f"{args.file}: warning: {line}", file=sys.stderr)  # as serve warns: not a refusal
        if found:
            for line in dict.fromkeys(found):
                print(f"{args.file}: {line}", file=sys.stderr)
            return 1
    print(f"{args.file}: OK")
    return 0


def _write_dir_problems(config: Config) -> list[str]:
    """The directories serve writes (state_dir: OPA's log and pid file; the audit database's; the audit
    head key's when the key is still to be made; audit.archive_dir), checked without writing: one
    that exists must be a directory this user may write; a missing one, creatable (serve makes it)."""
    dirs: list[tuple[str, Path]] = [
        ("state_dir", config.state_dir),
        ("audit.path: the directory", config.audit_path.parent),
    ]
    if not config.audit_key_path.exists():
        dirs.append(("audit.head_key_file: the directory", config.audit_key_path.parent))
    if config.audit_archive_dir is not None:
        dirs.append(("audit.archive_dir", config.audit_archive_dir))
    found = [f"{setting} {path}: {why}" for setting, path in dirs if (why := _not_writable(path)) is not None]
    key = config.audit_key_path
    if key.exists():  # the audit chain's HMAC key, read at start: opened, never read here
        try:
            with key.open("rb"):
                pass
        except OSError as exc:
            found.append(f"audit.head_key_file: cannot read {key}: {exc.strerror or exc}")
    return found


def _not_writable(path: Path) -> str | None:
    """Why serve could not write in `path` (making it first if missing), or None. os.access, not the
    mode bits: it also sees a read-only filesystem (a mode check would pass there, and fail root)."""
    if path.is_dir():
        return None if os.access(path, os.W_OK | os.X_OK) else "not writable by this user"
    if path.exists():
        return "not a directory"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"does not exist and cannot be made: {ancestor} is not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"does not exist and cannot be made: {ancestor} is not writable by this user"
    return None


def _reference(args: argparse.Namespace) -> int:
    from gateway.core.config_schema import reference

    text = reference()
    if args.output is None:
        sys.stdout.write(text)
    else:
        try:
            args.output.write_text(text)
        except OSError as exc:
            print(f"error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0


def register(sub: Any) -> None:
    c = sub.add_parser("config", help="check a configuration file; print the settings reference")
    csub = c.add_subparsers(dest="config_command", required=True)
    k = csub.add_parser(
        "check",
        help="check FILE against the configuration schema (starts nothing); exit 1 naming each problem, one line each",
    )
    k.add_argument(
        "--files",
        action="store_true",
        help="also check, as `pvegate serve` does at start, that the files it names (TLS, CA, JWKS, SSH key, bundle, "
        "connectors) and its secrets (files, environment variables; never shown) are there and readable, and that "
        "the directories it writes (state_dir, the audit's, the archive's) are writable or can be made: run it on "
        "the gateway's host, as its user, in its environment",
    )
    k.add_argument("file", type=Path, metavar="FILE", help="the pvegate.yaml to check")
    k.set_defaults(func=_check)
    r = csub.add_parser("reference", help="print the settings reference (docs/configuration.md) in Markdown")
    r.add_argument("--output", "-o", type=Path, help="write it to this file instead")
    r.set_defaults(func=_reference)
