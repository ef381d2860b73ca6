"""OPA's own fields under a service's `credentials` were read as secret references by their shape.

Every `{file: X}` or `{env: X}` mapping under `credentials` became a secret to read, not only the
schema's secret fields (bearer.token, oauth2.client_secret, oauth2.client_assertion,
client_tls.private_key_passphrase): an oauth2 `additional_parameters: {env: production}` (a form
parameter named `env`) made `pvegate config check --files` and the start refuse a valid file
("environment variable production is not set"), and `{env: HOME}` replaced the parameters by the
value of $HOME in OPA's config. OPA's fields now pass through as written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.core.config import load, service_secret_refs
from gateway.policy.opa_sidecar import OPASidecar
from tests.config.conftest import run_pvegate, write


def _with_oauth2(base: dict[str, Any], params: dict[str, str]) -> dict[str, Any]:
    base.setdefault("opa", {})["services"] = {
        "siem": {
            "url": "https://logs.example.internal",
            "credentials": {
                "oauth2": {
                    "token_url": "https://idp.example.internal/token",
                    "client_id": "opa",
                    "client_secret": {"file": "secrets/jwt"},
                    "additional_parameters": params,
                }
            },
        }
    }
    return base


def test_a_form_parameter_named_env_is_passed_as_written(base: dict[str, Any], tmp_path: Path) -> None:
    config = load(write(tmp_path, _with_oauth2(base, {"env": "HOME"})))
    assert [r.setting for r in service_secret_refs(config.opa.services)] == [
        "opa.services.siem.credentials.oauth2.client_secret"
    ]
    oauth2 = OPASidecar(services=config.opa.services).opa_config()["services"]["siem"]["credentials"]["oauth2"]
    assert oauth2["additional_parameters"] == {"env": "HOME"}
    assert oauth2["client_secret"] == "a-test-signing-secret-of-some-length"


def test_config_check_files_accepts_it(base: dict[str, Any], tmp_path: Path) -> None:
    path = write(tmp_path, _with_oauth2(base, {"env": "production"}))
    done = run_pvegate("config", "check", "--files", str(path))
    assert done.returncode == 0, done.stderr
