"""A simulator of our own: the resilience tests set faults and read its request log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv
from tests.resilience.helpers import resilient_env


@pytest.fixture(scope="package")
def rsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("rsim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def renv(rsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return resilient_env(tmp_path_factory.mktemp("rgw"), rsim)


@pytest.fixture(autouse=True)
def _no_faults(rsim: Any) -> Iterator[None]:
    yield
    rsim.set_faults(latency_ms=0, error_rate=0, drop_rate=0, offline_nodes=[], latency_path=None, error_path=None)
