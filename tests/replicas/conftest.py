"""Three gateway replicas on one PostgreSQL and one simulator, started once for this package."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.pgserver import start_postgres
from tests.replicas.harness import Cluster, start_cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from gateway.sim.harness import start_simulator

    pg = start_postgres()  # its own server: a test restarts it
    sim: Any = None
    try:
        dsn = asyncio.run(pg.create_database("replicas_"))
        sim = start_simulator("small", tmp_path_factory.mktemp("rsim"), ssh=False)
        c = asyncio.run(start_cluster(pg, dsn, sim, tmp_path_factory.mktemp("replicas")))
    except BaseException:
        if sim is not None:
            sim.stop()
        pg.stop()
        raise
    try:
        yield c
    finally:
        c.stop()
        sim.stop()
        pg.stop()
