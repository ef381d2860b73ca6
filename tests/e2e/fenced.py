"""A gateway over the example policy with a test's own data edit (a grant and a scoped deny beside it):
the reach tests of tests/e2e start one per test, on the simulator they are given."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.approvals.conftest import Api
from tests.support import GatewayThread, example_env


@contextlib.contextmanager
def fenced_gateway(sim: Any, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Iterator[Api]:
    """The gateway running over `sim` with the example data as `edit` leaves it; stopped at the end."""
    env = example_env(tmp_path, sim, edit)
    gateway = GatewayThread(env.config).start()
    try:
        yield Api(env)
    finally:
        gateway.stop()
