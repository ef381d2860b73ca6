"""Issue #19's floors: the Proxmox surface an administrator uses, counted the way
`pvegate tools list` counts it (one row per tool, the domain column naming its family)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.tools.catalog import Catalog

# family (domain) -> at least this many tools
FLOORS = {
    "guest": 16,  # guest create and config (and the lifecycle, power and agent tools)
    "backup": 10,
    "storage": 10,
    "node": 12,
    "firewall": 14,
    "ha": 8,
    "access": 14,  # identity and access
    "cluster": 10,  # cluster and pools
    "ceph": 8,
    "sdn": 8,
    "certificate": 4,  # certificates and subscription
    "task": 4,  # tasks and console
}
TOTAL = 200


def _domains() -> Counter[str]:
    return Counter(t.domain for t in Catalog.load(REPO_ROOT / "connectors").tools.values())


@pytest.mark.parametrize("family", sorted(FLOORS))
def test_each_family_meets_its_floor(family: str) -> None:
    assert _domains()[family] >= FLOORS[family], (family, _domains()[family], FLOORS[family])


def test_the_listing_counts_at_least_two_hundred_tools() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())", "tools", "list"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = [line for line in out.splitlines() if line.strip()]
    assert len(rows) >= TOTAL, len(rows)
    assert len(rows) == sum(_domains().values())  # one row per tool, nothing else
