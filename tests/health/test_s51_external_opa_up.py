"""`pvegate_opa_up` follows an external OPA, not only the managed sidecar.

With `opa.mode: external` the gauge was the constant 1 ("1 for an external OPA"): an alert on
`pvegate_opa_up == 0` never fired while every call failed closed for an OPA that was gone. It now
says what the readiness probe says of OPA (the `opa` check of /readyz): 0 once a probe round finds it
unreachable, 1 again once it decides again.

A real OPA run as docker/compose.yaml runs the external one (a signed bundle, token authentication),
stopped and started again on its port; a real gateway scraped with its scrape-only token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.policy.bundles import build, keygen
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.health.conftest import base_url, health_env, http_client, wait_for
from tests.health.test_metrics import scrape, value
from tests.support import ExternalOPA, GatewayThread


@pytest.fixture
def bundle_opa(tmp_path: Path) -> Iterator[ExternalOPA]:
    d = tmp_path / "external-opa"
    priv, pub = keygen(d / "keys")
    build(REPO_ROOT / "policies", d / "pvegate.tar.gz", priv, checks=False)  # checked by tests/bundles
    opa = ExternalOPA(["--bundle", str(d / "pvegate.tar.gz"), "--verification-key", str(pub)])
    yield opa.start()
    opa.stop()


def _opa_check(ok: bool) -> Any:
    return lambda r: r.json()["checks"]["opa"]["ok"] is ok


async def test_opa_up_follows_the_readiness_probe_of_an_external_opa(
    hsim: Any, tmp_path: Path, bundle_opa: ExternalOPA
) -> None:
    token, scrape_file = tmp_path / "opa-token", tmp_path / "scrape-token"
    token.write_text(bundle_opa.token + "\n")
    scrape_file.write_text("scrape-only-" + os.urandom(12).hex() + "\n")
    env = health_env(
        tmp_path / "gw",
        hsim,
        opa={"mode": "external", "url": bundle_opa.url, "token": {"file": str(token)}},
        metrics={"token": {"file": str(scrape_file)}},
    )
    scrape_token = scrape_file.read_text().strip()
    gw = GatewayThread(env.config).start()
    base = base_url(env.config)
    try:
        async with http_client(env) as http:
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200)
            assert value(await scrape(http, base, scrape_token), "pvegate_opa_up") == 1.0

            bundle_opa.stop()  # gone: every call fails closed
            red, _ = await wait_for(http, base + "/readyz", _opa_check(False), timeout=10)
            assert red.status_code == 503 and "opa: OPA unreachable" in " ".join(red.json()["reasons"]), red.text
            snap = await scrape(http, base, scrape_token)
            assert value(snap, "pvegate_health_check_ok", check="opa") == 0.0
            assert value(snap, "pvegate_opa_up") == 0.0  # the old code: 1, whatever became of OPA

            bundle_opa.start()  # the same port and token
            await wait_for(http, base + "/readyz", lambda r: r.status_code == 200, timeout=15)
            snap = await scrape(http, base, scrape_token)
            assert value(snap, "pvegate_health_check_ok", check="opa") == 1.0
            assert value(snap, "pvegate_opa_up") == 1.0
    finally:
        gw.stop()
