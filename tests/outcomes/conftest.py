"""A fresh simulator per test: its request log and task list are the witness of what Proxmox ran."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def fsim(tmp_path: Path) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()
