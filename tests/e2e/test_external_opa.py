"""opa.mode external: the gateway authenticates to an OPA that admits only its token, as in docker/compose.yaml.

The external OPA here is the real binary loading a signed bundle with token authentication, the
same command line the compose file gives the OPA container.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from gateway.app import start_opa
from gateway.core.config import ConfigError, OPAConfig, SecretRef
from gateway.dev.client import mcp_client
from gateway.dev.devenv import DevEnv
from gateway.policy.bundles import build, keygen
from gateway.policy.opa_sidecar import REPO_ROOT
from gateway.server import StartupError, check_opa
from tests.support import ExternalOPA, GatewayThread, audit_rows, free_port


@pytest.fixture(scope="module")
def opa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExternalOPA]:
    """A signed bundle served as the compose OPA serves it: its system.authz admits only the token."""
    d = tmp_path_factory.mktemp("external-opa")
    priv, pub = keygen(d / "keys")
    build(REPO_ROOT / "policies", d / "pvegate.tar.gz", priv, checks=False)  # checked by tests/bundles
    external = ExternalOPA(["--bundle", str(d / "pvegate.tar.gz"), "--verification-key", str(pub)]).start()
    yield external
    external.stop()


def _external(env: DevEnv, opa: ExternalOPA, token: SecretRef | None, name: str) -> object:
    return dataclasses.replace(
        env.config,
        port=free_port(),
        opa=OPAConfig(mode="external", url=opa.url, timeout_ms=2000, token=token),
        audit_path=env.config.audit_path.with_name(f"audit-external-{name}.db"),
    )


def test_external_mode_needs_a_token(env: DevEnv, opa: ExternalOPA, tmp_path: Path) -> None:
    cfg = _external(env, opa, None, "none")
    with pytest.raises(StartupError, match=r"opa\.mode external needs opa\.token"):
        check_opa(cfg)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"opa\.mode external needs opa\.token"):
        start_opa(cfg)  # type: ignore[arg-type]
    missing = _external(env, opa, SecretRef(file=tmp_path / "absent", setting="opa.token"), "absent")
    with pytest.raises(StartupError, match=r"opa\.token: cannot read secret file"):
        check_opa(missing)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"opa\.token: cannot read secret file"):
        start_opa(missing)  # type: ignore[arg-type]


async def test_the_gateway_sends_its_token_to_the_external_opa(env: DevEnv, opa: ExternalOPA, tmp_path: Path) -> None:
    secret = tmp_path / "opa-token"
    secret.write_text(opa.token + "\n")
    cfg = _external(env, opa, SecretRef(file=secret), "good")
    gw = GatewayThread(cfg).start()  # type: ignore[arg-type]
    try:
        url = f"https://127.0.0.1:{gw.config.port}/mcp"
        async with mcp_client(url, env.token("demo-agent", ["operator"]), env.ca_file) as client:
            assert "list_nodes" in {t.name for t in (await client.list_tools()).tools}
            res = await client.call_tool("list_nodes", {})
        assert not res.is_error, res.content
    finally:
        gw.stop()


async def test_a_wrong_token_fails_closed(env: DevEnv, opa: ExternalOPA, tmp_path: Path) -> None:
    secret = tmp_path / "opa-token"
    secret.write_text("not-the-token\n")
    cfg = _external(env, opa, SecretRef(file=secret), "wrong")
    gw = GatewayThread(cfg).start()  # type: ignore[arg-type]
    try:
        url = f"https://127.0.0.1:{gw.config.port}/mcp"
        async with mcp_client(url, env.token("demo-agent", ["operator"]), env.ca_file) as client:
            with pytest.raises(MCPError, match="policy decision unavailable"):  # never an empty listing
                await client.list_tools()
            res = await client.call_tool("list_nodes", {})
        assert res.is_error and "policy decision unavailable" in " ".join(c.text for c in res.content)
        meta = getattr(res, "meta", None) or {}
        rows = audit_rows(gw.config.audit_path, str(meta["pvegate/request_id"]))
        assert rows[-1]["kind"] == "decision" and '"failed_closed":true' in rows[-1]["body"]
    finally:
        gw.stop()


def test_an_external_opa_open_to_anyone_is_refused(env: DevEnv, tmp_path: Path) -> None:
    """The gateway will not trust an OPA whose API answers without a token (fail closed at start)."""
    (tmp_path / "p.rego").write_text("package probe\n\nx := 1\n")
    plain = ExternalOPA([str(tmp_path / "p.rego")], guarded=False).start()
    try:
        url = plain.url
        secret = tmp_path / "opa-token"
        secret.write_text("t0ken\n")
        cfg = dataclasses.replace(
            env.config, opa=OPAConfig(mode="external", url=url, timeout_ms=2000, token=SecretRef(file=secret))
        )
        with pytest.raises(ConfigError, match="answers without a token"):
            start_opa(cfg)
    finally:
        plain.stop()


async def test_an_external_opa_reopened_without_a_token_is_refused_while_it_is_open(
    env: DevEnv, tmp_path: Path
) -> None:
    """The start-up check is not enough: an OPA restarted without --authentication behind a running
    gateway must stop being trusted within a probe interval, and be trusted again once it is fixed."""
    guarded = ExternalOPA.policies(REPO_ROOT / "policies").start()
    port, token = guarded.port, guarded.token
    secret = tmp_path / "opa-token"
    secret.write_text(token + "\n")
    cfg = _external(env, guarded, SecretRef(file=secret), "reopened")
    gw = GatewayThread(cfg).start()  # type: ignore[arg-type]
    plain: ExternalOPA | None = None
    url = f"https://127.0.0.1:{gw.config.port}/mcp"
    agent = env.token("demo-agent", ["operator"])

    async def outcome() -> str:
        async with mcp_client(url, agent, env.ca_file) as client:
            res = await client.call_tool("list_nodes", {})
        return " ".join(c.text for c in res.content) if res.is_error else "ok"

    async def until(pred: object, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            got = await outcome()
            if pred(got) or time.monotonic() > deadline:  # type: ignore[operator]
                return got
            await asyncio.sleep(0.3)

    try:
        assert await outcome() == "ok"
        guarded.stop()
        plain = ExternalOPA.policies(REPO_ROOT / "policies", port=port, guarded=False).start()  # no token asked
        refused = await until(lambda t: "answers without a token" in t)
        assert "policy decision unavailable" in refused and "answers without a token" in refused, refused
        ready = httpx.get(
            f"https://127.0.0.1:{gw.config.port}/readyz",
            verify=ssl.create_default_context(cafile=str(env.ca_file)),
            timeout=5,
        )
        assert ready.status_code == 503 and "answers without a token" in ready.text, ready.text
        plain.stop()
        plain = None
        guarded = ExternalOPA.policies(REPO_ROOT / "policies", port=port, token=token).start()
        assert await until(lambda t: t == "ok") == "ok"
    finally:
        gw.stop()
        if plain is not None:
            plain.stop()
        guarded.stop()
