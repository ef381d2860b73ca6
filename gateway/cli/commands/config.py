"""`pvegate config`: check a configuration file without starting anything; print the settings reference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.core.config import ConfigError, load


def _check(args: argparse.Namespace) -> int:
    from gateway.cli import config_problems

    try:
        config = load(args.file)
    except ConfigError as exc:  # the file's problems are this command's finding: exit 1 (not 2, "cannot run")
        for line in config_problems(exc):
            print(line, file=sys.stderr)
        return 1
    if args.files:
        # serve's own read-only start checks (gateway/server.py), so the two cannot disagree; the
        # writable-directory and secret checks are left to serve (they create files, read the service's env)
        from gateway.server import StartupError, check_files, check_ssh_keys, check_tls

        try:
            check_files(config)
            check_ssh_keys(config)
            check_tls(config)
        except StartupError as exc:
            print(f"{args.file}: {exc}", file=sys.stderr)
            return 1
    print(f"{args.file}: OK")
    return 0


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
        "connectors) are there and readable: run it on the gateway's host, as its user",
    )
    k.add_argument("file", type=Path, metavar="FILE", help="the pvegate.yaml to check")
    k.set_defaults(func=_check)
    r = csub.add_parser("reference", help="print the settings reference (docs/configuration.md) in Markdown")
    r.add_argument("--output", "-o", type=Path, help="write it to this file instead")
    r.set_defaults(func=_reference)
