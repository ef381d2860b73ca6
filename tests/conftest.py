"""Shared fixtures: the real simulator, the real OPA sidecar, the real gateway."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from tests.kcserver import KeycloakServer, provision_realm, start_keycloak
from tests.pgserver import PostgresServer, start_postgres
from tests.support import GatewayThread, free_port


@pytest.fixture(scope="session", autouse=True)
def _serve_tmpdirs() -> Iterator[None]:
    """After the last test: the $TMPDIRs of the `pvegate serve` processes tests started
    (tests/outcomes/helpers.py), with what a gateway killed for good left in them."""
    yield
    helpers = sys.modules.get("tests.outcomes.helpers")
    for d in getattr(helpers, "TMPDIRS", []):
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fsim(tmp_path: Path) -> Iterator[Any]:
    """A simulator of the test's own: its request log and task list are the witness of what Proxmox ran,
    its faults are the test's alone."""
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path / "sim", ssh=False)
    yield handle
    handle.stop()


@pytest.fixture
def stdio(tmp_path: Path) -> Iterator[Any]:
    """Starts `pvegate stdio` processes for the test (tests/stdio_process.py); each is killed, with its
    OPA, at the end."""
    from tests.stdio_process import Stdio

    made: list[Stdio] = []

    def make(env: DevEnv) -> Stdio:
        made.append(Stdio(env, tmp_path))
        return made[-1]

    yield make
    for s in made:
        s.cleanup()


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("sim"))
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def env(sim: object, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return make_env(tmp_path_factory.mktemp("gw"), {"default": sim}, port=free_port())  # type: ignore[dict-item]


@pytest.fixture(scope="session")
def gateway(env: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(env.config).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="session")
def audit_db(env: DevEnv) -> Path:
    return env.config.audit_path


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL on 127.0.0.1 for the whole session (tests/pgserver.py: ~1.5 s to start)."""
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keycloak() -> Iterator[KeycloakServer]:
    """A real Keycloak (tests/kcserver.py) on 127.0.0.1 with realm `pvegate` provisioned: users alice
    (approver, group sre-leads) and bob (viewer), agent client pvegate-agent (client credentials),
    public console client pvegate-console (code + PKCE). About 10-20 s to start, once per session."""
    server = start_keycloak()
    try:
        provision_realm(server)
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()
