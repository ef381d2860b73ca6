"""An audit gateway: its own simulator (with SSH, for container tools), the repo's
connectors plus a test tool with a sensitive argument, the real OPA and policies."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.support import GatewayThread, free_port

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="package")
def xsim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("xsim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def connectors_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("connectors")
    for f in (REPO_ROOT / "connectors").glob("*.yaml"):
        shutil.copy(f, d / f.name)
    shutil.copy(HERE / "connectors" / "secret_probe.yaml", d / "zz_secret_probe.yaml")
    return d


@pytest.fixture(scope="package")
def xenv(xsim: Any, connectors_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(
        tmp_path_factory.mktemp("xgw"),
        {"default": xsim},
        port=free_port(),
        extra={"connectors_dir": str(connectors_dir)},
    )


@pytest.fixture(scope="package")
def xgw(xenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(xenv.config).start()
    yield gw
    gw.stop()
