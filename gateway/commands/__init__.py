"""CLI subcommand groups; each module exposes `register(subparsers) -> None`.

Each registered parser sets `func` (argparse.Namespace -> int exit status).
"""

from __future__ import annotations

import importlib

# One line per subcommand module; keep sorted.
MODULES: tuple[str, ...] = (
    "gateway.commands.approvals",
    "gateway.commands.audit",
    "gateway.commands.bundle",
    "gateway.commands.policy",
    "gateway.commands.tools",
)


def register_all(sub: object) -> None:
    for name in MODULES:
        importlib.import_module(name).register(sub)
