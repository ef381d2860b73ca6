"""`pvegate stdio`: MCP over stdin/stdout for one locally configured principal (desktop clients)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from gateway.core.config import load


def _stdio(args: argparse.Namespace) -> int:
    from gateway.observability.logs import configure
    from gateway.server import StartupError, serve_stdio_for

    config = load(args.config)  # a ConfigError is printed by main, one line per problem
    # as `serve` does: log_format honoured, and client text (a tool name) kept to one line in the log
    configure(config.log_format, logging.DEBUG if args.verbose else logging.INFO)
    try:
        serve_stdio_for(config, args.principal)
    except StartupError as exc:
        logging.getLogger("pvegate").debug("start-up failed", exc_info=True)
        print(f"pvegate: cannot start: {exc}", file=sys.stderr)
        return 2
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser(
        "stdio",
        help="serve MCP on stdin/stdout for one local principal (no network listener)",
        description=(
            "Run the gateway for one principal declared under local_principals in the configuration, "
            "speaking MCP over stdin/stdout, as desktop MCP clients start local servers. Every call goes "
            "through the same pipeline as `pvegate serve`: one OPA decision, the audit log, approvals by "
            "URL. stdout carries only protocol messages; logs go to stderr."
        ),
    )
    s.add_argument("--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway configuration file")
    s.add_argument("--principal", "-p", required=True, metavar="NAME", help="a name under local_principals")
    s.set_defaults(func=_stdio)
