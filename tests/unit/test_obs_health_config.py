"""How old the readiness probe's last OPA decision may be before the probe counts as stalled: long
enough for a probe round on an OPA that answers slowly but within opa.timeout_ms (a round asks it up to
three times), so a slow OPA is never reported as a stalled prober; and it follows opa.timeout_ms."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.core.config import HealthConfig, load
from tests.config.conftest import minimal, write


@pytest.mark.parametrize("interval", [0.5, 2.0, 30.0])
@pytest.mark.parametrize("timeout_ms", [1, 500, 5_000, 60_000])
def test_the_allowed_decision_age_covers_a_slow_probe_round(interval: float, timeout_ms: int) -> None:
    cfg = HealthConfig(opa_probe_interval=interval, opa_timeout=timeout_ms / 1000)
    slowest_round = 3 * timeout_ms / 1000  # the decision, its data check on a new revision, the probe's data check
    # the gap between two good decisions of a prober that works: its interval and one slow round
    assert cfg.opa_max_age > interval + slowest_round
    assert cfg.opa_max_age >= 3 * interval + 1 + slowest_round  # and the two spare intervals it always had
    assert cfg.opa_max_age <= 3 * interval + 1 + slowest_round + 1e-9  # no more: a stalled prober still shows


def test_the_allowed_decision_age_follows_opa_timeout_ms(tmp_path: Path) -> None:
    raw = minimal(tmp_path)
    raw["health"] = {"opa_probe_interval": 2}
    assert load(write(tmp_path, raw)).health.opa_max_age == pytest.approx(3 * 2 + 1 + 3 * 0.5)  # the 500 ms default
    raw["opa"] = {"timeout_ms": 60_000}
    health = load(write(tmp_path, raw)).health
    assert health.opa_timeout == 60.0
    assert health.opa_max_age == pytest.approx(3 * 2 + 1 + 3 * 60)
