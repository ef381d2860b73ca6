"""The managed OPA runs with a less eager Go collector, unless the operator chose one."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.opa_sidecar import OPASidecar

ROOT = Path(__file__).resolve().parents[2]


def _gogc_of(sidecar: OPASidecar) -> float:
    """What the running OPA's Go runtime reports as its GOGC (Prometheus metrics)."""
    text = httpx.get(f"{sidecar.url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("go_gc_gogc_percent "):
            return float(line.split()[1])
    raise AssertionError("OPA's /metrics has no go_gc_gogc_percent")


@pytest.mark.parametrize(("environ", "expected"), [(None, 400.0), ("150", 150.0)])
def test_sidecar_gogc(monkeypatch: pytest.MonkeyPatch, environ: str | None, expected: float) -> None:
    if environ is None:
        monkeypatch.delenv("GOGC", raising=False)
    else:
        monkeypatch.setenv("GOGC", environ)
    sidecar = OPASidecar(policies=(ROOT / "policies",), decision_logs=False)
    sidecar.start()
    try:
        assert _gogc_of(sidecar) == expected
    finally:
        sidecar.stop()
