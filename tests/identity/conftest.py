"""A gateway that trusts the real Keycloak (tests/kcserver.py, the session's `keycloak` fixture):
the approvals test policy (deterministic approval rules), the real OPA sidecar, simulator and
gateway, and an `auth` section with nothing but the provider's issuer, audience, JWKS and the
scope its tokens carry: the claim mapping is the default, which must fit a plain Keycloak realm."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import Api, write_policy_data
from tests.kcserver import SCOPE, KeycloakServer
from tests.support import GatewayThread, free_port

JWKS_CACHE_SECONDS = 3  # key removal is followed within seconds here (default 300)


@pytest.fixture(scope="package")
def isim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("isim"), ssh=False)
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def ienv(isim: Any, keycloak: KeycloakServer, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    policy = write_policy_data(tmp_path_factory.mktemp("ipolicy"))
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    # the scope an OAuth client must ask for: listed in the protected-resource metadata
    auth = {**keycloak.auth_config(), "jwks_cache_seconds": JWKS_CACHE_SECONDS, "required_scopes": [SCOPE]}
    return make_env(tmp_path_factory.mktemp("igw"), {"default": isim}, port=free_port(), opa=opa, extra={"auth": auth})


@pytest.fixture(scope="package")
def igw(ienv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(ienv.config).start()
    yield gw
    gw.stop()


@pytest.fixture(scope="package")
def iapi(igw: GatewayThread, ienv: DevEnv) -> Api:
    return Api(ienv)
