"""Identity settings that would never apply are refused at load, with the setting named (found by a
review): `auth.kind.agent_clients` with an empty `auth.client_id_claims` never reads a client id, so a
listed agent client's password-grant token (with a login session) passed as a human's, an approver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import ConfigError, load
from tests.config.conftest import minimal, write


def _refused(tmp_path: Path, auth: dict[str, Any]) -> str:
    raw = minimal(tmp_path)
    raw["auth"].update(auth)
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, raw))
    return str(info.value)


@pytest.mark.parametrize("setting", ["agent_clients", "human_clients"])
def test_client_lists_without_a_client_id_claim(tmp_path: Path, setting: str) -> None:
    why = _refused(tmp_path, {"client_id_claims": [], "kind": {setting: ["ci-agent"]}})
    assert f"auth.kind.{setting}: never applies when auth.client_id_claims is empty" in why


def test_kind_values_without_a_kind_claim(tmp_path: Path) -> None:
    why = _refused(tmp_path, {"kind": {"values": {"app": "agent"}}})
    assert "auth.kind.values: only used with auth.kind.claim" in why


def test_a_jwks_cache_time_without_a_jwks_url(tmp_path: Path) -> None:
    assert "auth.jwks_cache_seconds: only used with auth.jwks_url" in _refused(tmp_path, {"jwks_cache_seconds": 60})


def test_the_same_settings_where_they_apply_load(tmp_path: Path) -> None:
    raw = minimal(tmp_path)
    raw["auth"].update(
        client_id_claims=["azp"], kind={"agent_clients": ["ci-agent"], "claim": "idtyp", "values": {"app": "agent"}}
    )
    load(write(tmp_path, raw))
