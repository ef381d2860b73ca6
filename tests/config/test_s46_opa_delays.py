"""OPA's polling and reporting delays that OPA refuses: refused by `pvegate config check` too.

`opa.bundles.<name>.polling` and `opa.decision_logs_upload.reporting` with a min delay above the max,
or one of the two without the other, passed `pvegate config check` ("OK"); `pvegate serve` then
failed once OPA read them (`max polling delay must be >= min polling delay`, `polling configuration
missing 'max_delay_seconds'`). The same rules are now the configuration's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from tests.config.conftest import run_pvegate, write


def _bundle(c: dict[str, Any], polling: dict[str, int]) -> None:
    c["opa"] = {
        "allow_unsigned": True,
        "services": {"b": {"url": "https://bundles.example.net"}},
        "bundles": {"p": {"service": "b", "resource": "p.tar.gz", "polling": polling}},
    }


def _upload(c: dict[str, Any], reporting: dict[str, int]) -> None:
    c["opa"] = {
        "services": {"b": {"url": "https://logs.example.net"}},
        "decision_logs_upload": {"service": "b", "reporting": reporting},
    }


@pytest.mark.parametrize(
    ("section", "delays", "message"),
    [
        (
            _bundle,
            {"min_delay_seconds": 100, "max_delay_seconds": 10},
            "opa.bundles.p.polling.max_delay_seconds: must be at least min_delay_seconds (100), got 10",
        ),
        (
            _bundle,
            {"min_delay_seconds": 200},
            "opa.bundles.p.polling: give both min_delay_seconds and max_delay_seconds, or neither",
        ),
        (
            _bundle,
            {"max_delay_seconds": 200},
            "opa.bundles.p.polling: give both min_delay_seconds and max_delay_seconds, or neither",
        ),
        (
            _upload,
            {"min_delay_seconds": 700, "max_delay_seconds": 600},
            "opa.decision_logs_upload.reporting.max_delay_seconds: must be at least min_delay_seconds (700), got 600",
        ),
        (
            _upload,
            {"min_delay_seconds": 700},
            "opa.decision_logs_upload.reporting: give both min_delay_seconds and max_delay_seconds, or neither",
        ),
    ],
)
def test_delays_opa_refuses_are_refused(
    base: dict[str, Any], tmp_path: Path, section: Any, delays: dict[str, int], message: str
) -> None:
    section(base, delays)
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, base))
    (line,) = err.value.problems
    assert line.startswith(message), line


def test_config_check_says_so(base: dict[str, Any], tmp_path: Path) -> None:
    _bundle(base, {"min_delay_seconds": 100, "max_delay_seconds": 10})
    path = write(tmp_path, base)
    r = run_pvegate("config", "check", str(path))
    assert r.returncode == 1 and "max_delay_seconds: must be at least min_delay_seconds" in r.stderr, r


@pytest.mark.parametrize(
    ("section", "delays"),
    [
        (_bundle, {}),
        (_bundle, {"min_delay_seconds": 10, "max_delay_seconds": 10}),
        (_bundle, {"min_delay_seconds": 10, "max_delay_seconds": 60, "long_polling_timeout_seconds": 30}),
        (_upload, {}),
        (_upload, {"min_delay_seconds": 5, "max_delay_seconds": 30}),
    ],
)
def test_delays_opa_takes_still_load(
    base: dict[str, Any], tmp_path: Path, section: Any, delays: dict[str, int]
) -> None:
    section(base, delays)
    load(write(tmp_path, base))
