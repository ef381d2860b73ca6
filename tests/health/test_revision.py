"""What "the active policy revision" is: a bundle's revision from OPA's provenance, or the content
digest of a policy directory (tests/health/test_readiness.py checks that one)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from gateway.observability.health import probe_input
from gateway.policy.bundles import build, keygen
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.health.conftest import base_url, health_env, http_client
from tests.support import GatewayThread


def test_the_probe_input_is_a_valid_call_input() -> None:
    schema = json.loads(resources.files("gateway.schemas").joinpath("decision_input.schema.json").read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(probe_input())


async def test_bundle_revision_is_reported(hsim: Any, tmp_path: Path) -> None:
    priv, pub = keygen(tmp_path / "keys")
    rev = build(REPO_ROOT / "policies", tmp_path / "pvegate.tar.gz", priv, checks=False)  # checked in tests/policy
    opa = {"mode": "managed", "bundle": str(tmp_path / "pvegate.tar.gz"), "verification_key": str(pub)}
    env = health_env(tmp_path / "gw", hsim, opa=opa)
    gw = GatewayThread(env.config).start()
    try:
        async with http_client(env) as http:
            r = await http.get(base_url(env.config) + "/readyz")
        assert r.status_code == 200, r.text
        policy = r.json()["checks"]["policy"]
        assert policy["source"] == "bundle" and policy["revision"].endswith("@" + rev), policy
    finally:
        gw.stop()
