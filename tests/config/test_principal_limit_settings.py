"""The per-principal limits' settings (gateway/store/principal_limits.py): defaults, values, and the schema
refusing a mistyped key, a wrong type or a value below 1, as for every other setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from gateway.core.config_schema import problems
from tests.config.conftest import write

SETTINGS = ("max_inflight_per_principal", "refused_calls_per_minute_per_principal")


def test_defaults(base: dict[str, Any], tmp_path: Path) -> None:
    cfg = load(write(tmp_path, base))
    assert (cfg.max_inflight_per_principal, cfg.refused_calls_per_minute_per_principal) == (32, 120)


def test_values_are_read(base: dict[str, Any], tmp_path: Path) -> None:
    base.update(max_inflight_per_principal=4, refused_calls_per_minute_per_principal=7)
    cfg = load(write(tmp_path, base))
    assert (cfg.max_inflight_per_principal, cfg.refused_calls_per_minute_per_principal) == (4, 7)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("max_inflight_per_principle", 4, "did you mean max_inflight_per_principal?"),
        ("refused_calls_per_minute", 4, "did you mean refused_calls_per_minute_per_principal?"),
        ("max_inflight_per_principal", "32", "expected an integer, got '32'"),
        ("refused_calls_per_minute_per_principal", 1.5, "expected an integer"),
        ("max_inflight_per_principal", 0, "must be at least 1, got 0"),
        ("refused_calls_per_minute_per_principal", 0, "must be at least 1, got 0"),
        ("refused_calls_per_minute_per_principal", None, "expected an integer"),
    ],
)
def test_mistakes_are_refused(base: dict[str, Any], tmp_path: Path, key: str, value: Any, problem: str) -> None:
    base[key] = value
    (line,) = problems(base)
    assert line.startswith(f"{key}: ") and problem in line, line
    with pytest.raises(ConfigError):
        load(write(tmp_path, base))
