"""OPA's service credentials (a bundle server's or a log collector's bearer token) may live in a
file or an environment variable, as every other secret of the gateway, instead of in its
configuration file: read into OPA's private config only, refused at start when unreadable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.core.config import load
from gateway.policy.opa_sidecar import OPASidecar
from gateway.server import StartupError, check_secrets
from tests.config.conftest import write

TOKEN = "siem-bearer-token-0b9d7c"


def _with_service(base: dict[str, Any], token: Any) -> dict[str, Any]:
    base.setdefault("opa", {})["services"] = {
        "siem": {"url": "https://logs.example.internal", "credentials": {"bearer": {"token": token}}}
    }
    return base


def test_a_service_token_from_a_file_reaches_opas_config_only(base: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "secrets" / "siem").write_text(TOKEN + "\n")
    config = load(write(tmp_path, _with_service(base, {"file": "secrets/siem"})))
    assert TOKEN not in repr(config)
    check_secrets(config)
    opa = OPASidecar(services=config.opa.services)
    assert opa.opa_config()["services"]["siem"]["credentials"]["bearer"]["token"] == TOKEN


def test_a_service_token_from_the_environment(
    base: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PVEGATE_TEST_SIEM_TOKEN", TOKEN)
    config = load(write(tmp_path, _with_service(base, {"env": "PVEGATE_TEST_SIEM_TOKEN"})))
    opa = OPASidecar(services=config.opa.services)
    assert opa.opa_config()["services"]["siem"]["credentials"]["bearer"]["token"] == TOKEN


def test_an_unreadable_service_token_is_refused_at_start(base: dict[str, Any], tmp_path: Path) -> None:
    config = load(write(tmp_path, _with_service(base, {"file": "secrets/siem-typo"})))
    with pytest.raises(StartupError, match=r"opa.services.siem.credentials.bearer.token: cannot read secret file"):
        check_secrets(config)


def test_an_inline_token_is_refused_without_showing_it(base: dict[str, Any], tmp_path: Path) -> None:
    """Inline, the token would sit in the configuration file: refused as every other inline secret."""
    from gateway.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"opa.services.siem.credentials.bearer.token: expected \{file") as err:
        load(write(tmp_path, _with_service(base, TOKEN)))
    assert TOKEN not in str(err.value)


def test_the_audit_scrubs_service_credentials_and_the_metrics_token(base: dict[str, Any], tmp_path: Path) -> None:
    """The audit's last line of defence knows every secret of the gateway's own, these too."""
    from gateway.store.audit import known_secrets

    (tmp_path / "secrets" / "siem").write_text(TOKEN + "\n")
    (tmp_path / "secrets" / "metrics").write_text("metrics-scrape-token-77aa01\n")
    base["metrics"] = {"token": {"file": "secrets/metrics"}}
    config = load(write(tmp_path, _with_service(base, {"file": "secrets/siem"})))
    assert {TOKEN, "metrics-scrape-token-77aa01"} <= set(known_secrets(config))


@pytest.mark.parametrize(
    ("upload", "named"),
    [
        # OPA's own mask path, mistyped (`logs` for `log`): OPA would mask nothing and send the
        # arguments, passwords included (found by a review); the gateway's mask is system.log.mask
        ({"service": "siem", "mask_decision": "/system/logs/mask"}, "mask_decision"),
        ({"service": "siem", "drop_decision": "/system/log/drop"}, "drop_decision"),
        ({"service": "siem", "console": True}, "console"),
        ({"service": "siem", "reportng": {"min_delay_seconds": 5}}, "reportng"),
        ({"service": "siem", "reporting": {"min_delay_secs": 5}}, "min_delay_secs"),
        ({"reporting": {"min_delay_seconds": 5}}, "service"),
    ],
)
def test_decision_log_upload_settings_are_checked(
    base: dict[str, Any], tmp_path: Path, upload: dict[str, Any], named: str
) -> None:
    from gateway.core.config import ConfigError

    doc = _with_service(base, {"env": "PVEGATE_TEST_SIEM_TOKEN"})
    doc["opa"]["decision_logs_upload"] = upload
    with pytest.raises(ConfigError, match=named):
        load(write(tmp_path, doc))


def test_a_decision_log_upload_as_documented_loads(base: dict[str, Any], tmp_path: Path) -> None:
    doc = _with_service(base, {"env": "PVEGATE_TEST_SIEM_TOKEN"})
    upload = {"service": "siem", "reporting": {"min_delay_seconds": 5, "max_delay_seconds": 30, "trigger": "periodic"}}
    doc["opa"]["decision_logs_upload"] = upload
    config = load(write(tmp_path, doc))
    assert OPASidecar(decision_logs_upload=config.opa.decision_logs_upload).opa_config()["decision_logs"] == upload


@pytest.mark.parametrize(
    ("service", "named"),
    [
        ({"ulr": "https://logs.example.internal"}, "ulr"),
        ({"url": "logs.example.internal"}, "url"),
        ({"url": "https://logs.example.internal", "credentials": {"barer": {"token": {"env": "X"}}}}, "barer"),
        ({"url": "https://logs.example.internal", "tls": {"ca_certs": "/etc/ca.pem"}}, "ca_certs"),
    ],
)
def test_a_mistyped_service_setting_is_refused(
    base: dict[str, Any], tmp_path: Path, service: dict[str, Any], named: str
) -> None:
    from gateway.core.config import ConfigError

    base.setdefault("opa", {})["services"] = {"siem": service}
    with pytest.raises(ConfigError, match=named):
        load(write(tmp_path, base))
