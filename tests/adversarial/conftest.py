"""A gateway of its own for the adversarial corpus: simulator (with SSH), real OPA,
own audit database, so every audit and simulator-log delta belongs to one input."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from tests.support import GatewayThread, free_port


@pytest.fixture(scope="package")
def advsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("advsim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def advenv(advsim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("advgw"), {"default": advsim}, port=free_port())


@pytest.fixture(scope="package")
def advgw(advenv: DevEnv) -> Iterator[GatewayThread]:
    # These tests are about what hostile input does to other calls, not latency: on a loaded CI
    # machine OPA's 500 ms budget ran out under the 80-call burst and an honest call failed closed
    # for a reason no input caused. The OPA timeout's own behaviour is tested in tests/resilience.
    opa = dataclasses.replace(advenv.config.opa, timeout_ms=5000)
    gw = GatewayThread(dataclasses.replace(advenv.config, opa=opa)).start()
    yield gw
    gw.stop()
