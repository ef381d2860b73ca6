"""The configuration the demo, the end-to-end tests and the benchmarks generate passes the schema."""

from __future__ import annotations

import yaml

from gateway.core.config_schema import problems
from gateway.dev.devenv import DevEnv


def test_devenv_config_is_valid(env: DevEnv) -> None:
    """gateway/devenv.py's file, around the real simulator (with its SSH nodes and pinned host keys)."""
    raw = yaml.safe_load(env.config_path.read_text())
    assert raw["clusters"][0]["ssh"]["nodes"], "the simulator should expose SSH nodes"
    assert problems(raw) == []
