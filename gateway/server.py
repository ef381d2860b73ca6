"""Running the gateway under uvicorn, with TLS unless plain HTTP was asked for on loopback."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

import uvicorn
from starlette.applications import Starlette

from gateway.app import build_components, create_app
from gateway.auth.tokens import Authenticator
from gateway.core.config import Config, ConfigError
from gateway.startup import StartupError, bind, describe, preflight

log = logging.getLogger("pvegate")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def uvicorn_config(config: Config, app: Starlette | None = None) -> uvicorn.Config:
    tls: dict[str, str] = {}
    if config.tls.insecure_http:
        if not _is_loopback(config.host):
            raise ConfigError("plain HTTP (tls.insecure_http) is only allowed on a loopback address")
        log.warning("serving plain HTTP on %s:%d (tls.insecure_http): loopback only", config.host, config.port)
    else:
        if not (config.tls.cert and config.tls.key):
            raise ConfigError("tls.cert and tls.key are required (or tls.insecure_http on loopback)")
        tls = {"ssl_certfile": str(config.tls.cert), "ssl_keyfile": str(config.tls.key)}
    return uvicorn.Config(
        app or create_app(config),
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        # uvicorn believes X-Forwarded-For from loopback by default: a local client could then
        # choose the source address the audit and the policy see. Only configured proxies count.
        proxy_headers=bool(config.trusted_proxies),
        forwarded_allow_ips=list(config.trusted_proxies) or None,
        **tls,  # type: ignore[arg-type]
    )


def serve(config: Config) -> None:
    """Run the gateway until it is stopped; StartupError (one line: why) if it cannot start.

    Unlike an app started by uvicorn's lifespan (as the tests do), the components are built
    here first, so that a failure is an exception we can describe rather than uvicorn's
    traceback followed by a quiet exit.
    """
    preflight(config)
    sock = bind(config)
    try:
        asyncio.run(_serve(config, sock))
    finally:
        sock.close()


async def _serve(config: Config, sock: socket.socket) -> None:
    try:
        authenticator = Authenticator(config.auth)
        components = await build_components(config)
    except Exception as exc:
        raise StartupError(describe(exc)) from exc  # the CLI logs the traceback at debug level
    app = create_app(config, components, authenticator)
    try:
        await uvicorn.Server(uvicorn_config(config, app)).serve(sockets=[sock])
    finally:
        if not hasattr(app.state, "components"):  # the lifespan, which closes them, never ran
            await components.close()
