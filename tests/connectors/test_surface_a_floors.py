"""Issue #19's floors for the node, storage, cluster, task and certificate families, counted
as `pvegate tools list` counts them (the domain column), and the shape each new tool must have."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.tools.catalog import Catalog
from tests.connectors.test_catalog import CONNECTORS
from tests.connectors.test_cluster_pools_e2e import CLUSTER_TOOLS
from tests.connectors.test_node_ops_e2e import NODE_TOOLS
from tests.connectors.test_storage_content_e2e import STORAGE_TOOLS
from tests.connectors.test_tasks_certs_e2e import CERT_TOOLS, TASK_TOOLS

# before the issue: node 6, storage 4, cluster 7, task 4, certificate 0
FLOORS = {"node": 6 + 14, "storage": 4 + 10, "cluster": 7 + 9, "task": 4 + 3, "certificate": 5}
NEW = NODE_TOOLS | STORAGE_TOOLS | CLUSTER_TOOLS | TASK_TOOLS | CERT_TOOLS


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(CONNECTORS)


def test_family_floors(catalog: Catalog) -> None:
    counts = Counter(t.domain for t in catalog)
    for domain, floor in FLOORS.items():
        assert counts[domain] >= floor, (domain, counts[domain], floor)
    assert len(NEW) >= 41


def test_new_tools_are_declared_like_the_rest(catalog: Catalog) -> None:
    for name in NEW:
        t = catalog.get(name)
        assert t is not None, name
        assert t.domain in FLOORS, (name, t.domain)
        if t.effect != "read":
            assert t.dry_run, name  # every mutation says what it would do
        else:
            assert t.annotations["readOnlyHint"] is True, name
        if t.connector == "pve_api" and t.effect == "read":
            assert t.output.get("fields") or t.output.get("wrap"), f"{name}: no output projection"
