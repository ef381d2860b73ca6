"""CLI subcommand groups; each module exposes `register(subparsers) -> None`.

Each registered parser sets `func` (argparse.Namespace -> int exit status).
"""

from __future__ import annotations

import importlib

# One line per subcommand module; keep sorted.
MODULES: tuple[str, ...] = (
    "gateway.cli.commands.approvals",
    "gateway.cli.commands.audit",
    "gateway.cli.commands.bundle",
    "gateway.cli.commands.config",
    "gateway.cli.commands.console",
    "gateway.cli.commands.db",
    "gateway.cli.commands.policy",
    "gateway.cli.commands.stdio",
    "gateway.cli.commands.tools",
)


def register_all(sub: object) -> None:
    for name in MODULES:
        importlib.import_module(name).register(sub)
