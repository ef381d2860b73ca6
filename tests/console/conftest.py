"""A console gateway: the approvals test policy (deterministic approval rules) with step-up on
every risk level, the console enabled, the real OPA sidecar, simulator and gateway.

Page tests here need no identity provider: they present a session cookie signed with the
gateway's session key (what a sign-in ends with). Signing in itself is tested only against the
real Keycloak, in test_browser.py."""

from __future__ import annotations

import secrets
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import yaml
from starlette.responses import Response

from gateway.admin.console.session import SESSION_COOKIE, Session, Sessions
from gateway.core.principal import Principal
from gateway.dev.devenv import DevEnv, make_env
from gateway.policy.opa_sidecar import REPO_ROOT
from tests.approvals.conftest import Api, write_policy_data
from tests.support import GatewayThread, free_port

STEP_UP_SECONDS = 300
AUTH_AGE = 5.0  # seconds since a Browser's sign-in: well within the step-up limit


def console_policy(
    root: Path,
    step_up: int = STEP_UP_SECONDS,
    approver_sections: str | None = None,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """The approvals test data, a step-up limit on every risk level, (approver_sections="all")
    every console section open to approvers (the browser test's alice takes the screenshots), and
    the test's own `edit` of the data."""
    write_policy_data(root)
    path = root / "data" / "data.yaml"
    data = yaml.safe_load(path.read_text())
    levels = ("low", "medium", "high", "critical")
    data["approval"]["step_up_max_age_seconds_by_level"] = dict.fromkeys(levels, step_up)
    if approver_sections == "all":
        data["roles"]["approver"]["console"] = ["approvals", "audit", "policy"]
    if edit is not None:
        edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return root


def console_extra(workdir: Path, issuer: str, port: int) -> dict[str, Any]:
    key = workdir / "console-session-key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text(secrets.token_urlsafe(48))
    key.chmod(0o600)
    return {
        "console": {
            "enabled": True,
            "issuer": issuer,
            "client_id": "pvegate-console",
            "session_key": {"file": str(key)},
            "idle_timeout_seconds": 600,
        },
    }


@pytest.fixture(scope="package")
def csim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from gateway.sim.harness import start_simulator

    handle = start_simulator("small", tmp_path_factory.mktemp("csim"), ssh=False)
    yield handle
    handle.stop()


def console_env(
    tmp_path_factory: pytest.TempPathFactory,
    sim: Any,
    name: str,
    policy: Path,
    issuer: str | None = None,
    auth: dict[str, Any] | None = None,
) -> DevEnv:
    """A console gateway on `sim` with the repository's policy and the test `policy` data beside it.
    Without an `issuer`, none listens where the console points: such tests never sign in
    (test_browser.py does, at Keycloak)."""
    opa = {
        "mode": "managed",
        "policies": [str(REPO_ROOT / "policies" / "pvegate"), str(REPO_ROOT / "policies" / "system"), str(policy)],
    }
    work = tmp_path_factory.mktemp(f"{name}gw")
    port = free_port()
    extra = console_extra(work, issuer or f"http://127.0.0.1:{free_port()}/realms/none", port)
    if auth is not None:
        extra["auth"] = auth
    return make_env(work, {"default": sim}, port=port, opa=opa, extra=extra)


@pytest.fixture(scope="package")
def cenv(csim: Any, tmp_path_factory: pytest.TempPathFactory) -> DevEnv:
    return console_env(tmp_path_factory, csim, "c", console_policy(tmp_path_factory.mktemp("cpolicy")))


@pytest.fixture(scope="package")
def cgw(cenv: DevEnv) -> Iterator[GatewayThread]:
    gw = GatewayThread(cenv.config).start()
    yield gw
    gw.stop()


class Browser:
    """An HTTP client holding a console session, as a browser would after signing in."""

    def __init__(self, env: DevEnv, principal: Principal | None, auth_age: float = AUTH_AGE) -> None:
        self.env = env
        self.base = env.url.rsplit("/mcp", 1)[0]
        self.http = httpx.Client(
            verify=ssl.create_default_context(cafile=str(env.ca_file)),
            timeout=30.0,
            headers={"accept": "text/html"},
            follow_redirects=False,
        )
        self.session: Session | None = None
        if principal is not None:
            self.session = Session.start(principal, principal.sub, time.time() - auth_age)
            self.http.cookies.set(SESSION_COOKIE, cookie_value(env, self.session), domain="127.0.0.1", path="/")

    @property
    def csrf(self) -> str:
        assert self.session is not None
        return self.session.csrf

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(self.base + path, **kw)

    def post(self, path: str, data: dict[str, str], **kw: Any) -> httpx.Response:
        return self.http.post(self.base + path, data=data, **kw)

    def close(self) -> None:
        self.http.close()


class Browsers(Protocol):
    def __call__(self, env: DevEnv, principal: Principal | None, auth_age: float = AUTH_AGE) -> Browser: ...


@pytest.fixture
def browsers() -> Iterator[Browsers]:
    """Makes a test's `Browser`s (principal None: anonymous) and closes every one at its end, also
    when an assertion failed first (a close at the end of the test body leaked the client then)."""
    with ExitStack() as made:

        def make(env: DevEnv, principal: Principal | None, auth_age: float = AUTH_AGE) -> Browser:
            b = Browser(env, principal, auth_age)
            made.callback(b.close)
            return b

        yield make


def sessions_of(env: DevEnv) -> Sessions:
    cfg = env.config.console
    assert cfg.session_key is not None
    return Sessions(cfg.session_key.read(), cfg.idle_timeout_seconds, cfg.max_session_seconds)


def cookie_value(env: DevEnv, session: Session) -> str:
    out = Response()
    sessions_of(env).write(out, session)
    header = out.headers["set-cookie"]
    return header.split(";", 1)[0].split("=", 1)[1]


def human(sub: str, roles: list[str], groups: list[str]) -> Principal:
    return Principal(sub, "https://issuer.test", tuple(roles), tuple(groups), (), "pvegate-console", "human")


CAROL = human("carol", ["approver"], ["sre-leads"])  # an approver in the approval rules' group


@pytest.fixture(scope="module")
def api(cgw: GatewayThread, cenv: DevEnv) -> Api:
    return Api(cenv)


@pytest.fixture
def carol(cgw: GatewayThread, cenv: DevEnv, browsers: Browsers) -> Browser:
    return browsers(cenv, CAROL)
