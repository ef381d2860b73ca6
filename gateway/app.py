"""The Starlette application: routes, and the lifespan that builds the components."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin.api import admin_routes, scrape
from gateway.admin.console.views import Console, console_routes
from gateway.auth.tokens import Authenticator
from gateway.components import Components
from gateway.core.config import Config, ConfigError
from gateway.mcp.request_state import RequestStates, Sealer, Sessions
from gateway.mcp.security import TransportGuard
from gateway.mcp.transport import handle_mcp
from gateway.mcp.wellknown import WELL_KNOWN, protected_resource, token_resource
from gateway.observability.health import HealthMonitor
from gateway.observability.logs import ErrorBoundary
from gateway.observability.metrics import Metrics
from gateway.policy.bundle_status import PolicyStatus
from gateway.policy.decisions import DecisionClient
from gateway.policy.listings import ListingCache
from gateway.policy.opa_guard import opa_is_open, open_access_message
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar
from gateway.store.approvals import build_approvals
from gateway.store.audit import AuditLog, known_secrets
from gateway.store.backend import refuse_unshared
from gateway.store.db import one_pool
from gateway.store.handoffs import MIGRATIONS as HANDOFF_MIGRATIONS
from gateway.store.handoffs import SharedStates
from gateway.store.holds import MemoryHolds, build_holds
from gateway.store.migrations import check
from gateway.store.pgsync import audit_location
from gateway.store.reconcile import Reconciler
from gateway.store.shared_keys import state_key
from gateway.store.usage import build_quotas
from gateway.tools.catalog import Catalog
from gateway.tools.runtimes.base import TEST_FAULT_ENV, Runtime, test_fault
from gateway.tools.runtimes.composite import CompositeRuntime
from gateway.tools.runtimes.pve_api import PveApiClient, PveApiRuntime
from gateway.tools.runtimes.ssh import AllowList, SshRuntime
from gateway.tools.targets import TargetResolver

log = logging.getLogger("pvegate")


def default_policy_paths() -> tuple[Path, ...]:
    return (REPO_ROOT / "policies",)


def external_opa_token(config: Config) -> str:
    """The API token for an external OPA: its API must admit only the gateway (docs/deployment.md)."""
    if config.opa.token is None:
        raise ConfigError(
            "opa.mode external needs opa.token ({file: PATH} or {env: NAME}): the bearer token that OPA's "
            "system.authz policy admits (OPA run with --authentication=token --authorization=basic)"
        )
    token = config.opa.token.read()  # ConfigError naming opa.token when unreadable
    if not token:
        raise ConfigError("opa.token is empty")
    return token


def refuse_open_opa(url: str) -> None:
    """An external OPA that answers without a token serves policy and data to anyone who reaches it."""
    is_open = opa_is_open(url)
    if is_open is None:
        log.warning("OPA at %s not reachable at start: calls are refused until it is", url)
    elif is_open:
        raise ConfigError(open_access_message(url))


def opa_api_token(config: Config, sidecar: OPASidecar | None) -> str | None:
    """The token to send to the OPA start_opa returned: none to the sidecar (its private socket is
    the guard, policy/opa_sidecar.py), the external one's otherwise."""
    return None if sidecar is not None else external_opa_token(config)


def bundle_signed(config: Config) -> bool | None:
    """Whether the managed OPA checks its bundles' signatures; None: no bundle (a policy directory
    on this host, or an external OPA that loads its own)."""
    opa = config.opa
    if opa.mode == "external" or not (opa.bundle or opa.bundles):
        return None
    if opa.bundle is not None:
        return opa.verification_key is not None
    signing = [entry.get("signing") or {} for entry in opa.bundles.values()]
    return all(s.get("keyid") and not s.get("exclude_files") for s in signing)


def start_opa(config: Config, *, gateway: bool = True) -> tuple[str, OPASidecar | None]:
    """Start the managed sidecar (or use the external URL); returns the URL to ask.

    `gateway=False` is a CLI command's short-lived OPA: it keeps out of the pid file, which
    belongs to the gateway's OPA (a restarted gateway reaps what that file names).
    """
    if config.opa.mode == "external":
        return external_opa(config), None
    sidecar = managed_sidecar(config, gateway=gateway)
    sidecar.start()
    return sidecar.url, sidecar


def external_opa(config: Config) -> str:
    """The external OPA's URL, once its token is readable and its API is found closed to others."""
    if not config.opa.url:
        raise ConfigError("opa.mode external needs opa.url")
    external_opa_token(config)  # fail at start, not at the first call
    refuse_open_opa(config.opa.url)
    return config.opa.url


def managed_sidecar(config: Config, *, gateway: bool = True) -> OPASidecar:
    """The managed OPA, not started yet."""
    if bundle_signed(config) is False:
        log.warning(
            "opa.allow_unsigned: the policy bundle's signature is NOT checked; anyone who can change the "
            "bundle decides every call (development only)"
        )
    return OPASidecar(
        policies=config.opa.policies or default_policy_paths(),
        bundle=config.opa.bundle,
        verification_key=config.opa.verification_key,
        binary=config.opa.binary,
        log_file=config.state_dir / "opa.log",
        pid_file=config.state_dir / "opa.pid" if gateway else None,
        decision_logs=config.opa.decision_logs,
        services=config.opa.services,
        bundles=config.opa.bundles,
        keys=config.opa.keys,
        decision_logs_upload=config.opa.decision_logs_upload,
        watch_bundle=config.opa.watch_bundle,
        bundle_poll_seconds=config.opa.bundle_poll_seconds,
    )


async def start_sidecar(sidecar: OPASidecar) -> None:
    """sidecar.start() in a worker thread, which a cancellation (`pvegate serve` stopped by a signal
    while OPA starts) cannot stop: then OPA is stopped as soon as it runs and the start has ended, so
    that nothing it started outlives the gateway (OPA runs in its own session)."""
    starting = asyncio.ensure_future(asyncio.to_thread(sidecar.start))
    try:
        await asyncio.shield(starting)
    except asyncio.CancelledError:
        while not starting.done():
            process = sidecar.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(OSError):
                    process.terminate()  # its start (waiting for OPA to answer) then fails at once
            await asyncio.wait([starting], timeout=0.05)
        if not starting.cancelled() and starting.exception() is None:
            sidecar.stop()  # it had started: stop it (a failed start stopped what it started itself)
        raise


async def build_components(config: Config) -> Components:
    refuse_unshared(config)  # before anything starts: never per-process state believed shared
    catalog = Catalog.load(config.connectors_dir)
    if config.opa.mode == "external":
        url, sidecar = await asyncio.to_thread(external_opa, config), None
    else:
        sidecar = managed_sidecar(config)
        await start_sidecar(sidecar)
        url = sidecar.url
    try:
        return await _build_on(config, catalog, url, sidecar)
    except BaseException:
        if sidecar is not None:  # it runs in its own session: it would outlive us
            sidecar.stop()
        raise


async def _build_on(config: Config, catalog: Catalog, url: str, sidecar: OPASidecar | None) -> Components:
    audit = AuditLog(audit_location(config), secrets=known_secrets(config), head_key=config.audit_key_path)
    await audit.open()
    try:
        # the quota, hold and approval stores share one PostgreSQL pool: storage.pool_max_size connections in all
        async with one_pool():
            return await _build_with(config, catalog, url, sidecar, audit)
    except BaseException:  # its writer task and connection thread would keep the process from exiting
        await audit.close()
        raise


async def _build_with(
    config: Config, catalog: Catalog, url: str, sidecar: OPASidecar | None, audit: AuditLog
) -> Components:
    usage = await build_quotas(config, audit)
    holds = await build_holds(config)
    api_token = opa_api_token(config, sidecar)
    policy_status = PolicyStatus(url, sidecar.source if sidecar else "external", token=api_token)
    local_revision = local_name = None
    if sidecar is not None and sidecar.bundle is None and not sidecar.bundles:
        # a policy directory: OPA's provenance names no revision; each (re)start may load new files
        local_revision = sidecar.revision_key

        def local_name() -> str | None:
            return sidecar.policy_revision

    decisions = DecisionClient(
        url, config.opa.timeout_ms, token=api_token, local_revision=local_revision, local_name=local_name
    )
    clients = {name: PveApiClient(cl) for name, cl in config.clusters.items()}
    targets = TargetResolver(clients, config.target_cache_seconds)
    runtimes: dict[str, Runtime] = {
        "pve_api": PveApiRuntime(clients, targets),
        "ssh": SshRuntime(config.clusters, targets, AllowList(catalog)),
    }
    runtimes["composite"] = CompositeRuntime(catalog, dict(runtimes), config.clusters)
    metrics = Metrics()
    components = Components(
        config=config,
        catalog=catalog,
        audit=audit,
        decisions=decisions,
        targets=targets,
        approvals=await build_approvals(config, audit, decisions),
        runtimes=runtimes,
        usage=usage,
        holds=holds,
        listings=ListingCache(ttl=config.tools_list_cache_seconds),
        sidecar=sidecar,
        policy_status=policy_status,
        metrics=metrics,
        health=HealthMonitor(
            config.health,
            decisions,
            audit,
            metrics,
            sidecar,
            clients,
            policy_status=policy_status,
            audit_min_free_bytes=int(config.audit_min_free_mb * 1024 * 1024),
            external_opa_url=config.opa.url if config.opa.mode == "external" else None,
            bundle_signed=bundle_signed(config),
            catalog=catalog,
        ),
        clients=clients,
    )
    metrics.attach(components)
    return components


async def shared_states(c: Components) -> SharedStates | None:
    """Request-state nonces and legacy handoffs in the approvals' database (where every replica
    finds them); None without an approval store (then nothing is handed off)."""
    store = c.approvals.store
    if store is None:
        return None
    await check(store.database, "handoffs", HANDOFF_MIGRATIONS)
    return SharedStates(store.database)


def _health_monitor(request: Request) -> HealthMonitor:
    c: Components = request.app.state.components
    assert c.health is not None
    return c.health


async def livez(request: Request) -> Response:
    """The process answers (its event loop runs). Nothing else: restart only a process that is stuck."""
    return JSONResponse({"status": "alive"}, headers={"Cache-Control": "no-store"})


async def readyz(request: Request) -> Response:
    """May a load balancer send agents here? 503 with the reasons when not (observability/health.py). No
    credential is asked: the public view, in the gateway's own words (the store's or OPA's text of an error
    is for GET /admin/health)."""
    ready, doc = _health_monitor(request).readiness()  # the public view (the default)
    return JSONResponse(doc, status_code=200 if ready else 503, headers={"Cache-Control": "no-store"})


def create_app(
    config: Config, components: Components | None = None, authenticator: Authenticator | None = None
) -> Starlette:
    """The application; `pvegate serve` passes components it built (and checked) itself."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        """Start-up after the components are built, serving, shut-down; the components are closed when it
        ends, also when the start-up fails (else OPA, in its own session, and the audit store's thread
        would outlive a gateway that never served). `pvegate serve` enters it itself, before uvicorn."""
        started_at = time.time()  # calls decided before this are earlier runs' to reconcile
        built = components or await build_components(config)
        tasks: list[asyncio.Task[None]] = []
        try:
            app.state.components = built
            app.state.authenticator = authenticator or Authenticator(config.auth, resource=token_resource(config))
            # the keys tokens are verified with: none held, not ready; unless HS256 tokens are taken too (their
            # secret verifies them whatever the provider does), or the JWKS is never used
            if built.health is not None and not any(a.upper().startswith("HS") for a in config.auth.algorithms):
                built.health.jwks = app.state.authenticator.jwks
            if config.console.enabled:  # the session key and client secret are read once, here
                app.state.console = Console(built, app.state.authenticator)
            # one key for every replica (state_key or the database): a retry may reach any of them
            sealer = Sealer(await state_key(config))
            shared = await shared_states(built)
            app.state.request_states = RequestStates(sealer, shared=shared)
            if config.console.enabled:
                app.state.console.signouts = shared
            app.state.sessions = Sessions(sealer)
            if built.sidecar:
                tasks.append(asyncio.create_task(built.sidecar.supervise()))
            if built.policy_status is not None:  # known before the first request, then kept fresh
                await built.policy_status.refresh_once()
                tasks.append(asyncio.create_task(built.policy_status.run()))
            if built.health is not None:
                await built.health.start()  # readiness is known before the first request
            built.outcomes.start()
            # what earlier runs left open (killed, cut off): read now, before the first call (every call open now
            # is theirs, whatever the time on it), settled from Proxmox's answers in the background
            reconciler = Reconciler(config, built.catalog, built.outcomes, built.clients)
            # SQLite: this process's holds, so what earlier runs held is taken again
            own_holds = built.holds if isinstance(built.holds, MemoryHolds) else None
            await reconciler.read_earlier(started_at, own_holds)
            tasks.append(reconciler.start(started_at))
            if built.health is not None:  # its task, last pass and open calls: /readyz, /admin/health, /metrics
                built.health.reconciler = reconciler
            if test_fault("kill-after-dispatch-response"):
                log.warning("test fault %s is set: this gateway kills itself after a mutation", TEST_FAULT_ENV)
            if test_fault("stop-before-send") or test_fault("stop-after-decision"):
                log.warning(
                    "test fault %s is set: this gateway stops itself (SIGSTOP) before a mutation", TEST_FAULT_ENV
                )
            log.info("pvegate ready: %d tools, OPA at %s", len(built.catalog), built.decisions.url)
            yield
        finally:
            try:
                for task in tasks:
                    task.cancel()
                    # a task that died already (its error was logged when it did) must not stop
                    # the shutdown before OPA and the stores are closed
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            finally:
                await built.close()

    routes = [
        Route("/mcp", handle_mcp, methods=["GET", "POST", "DELETE"]),
        Route("/livez", livez, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/healthz", readyz, methods=["GET"]),  # kept for existing probes: readiness, not liveness
        Route(WELL_KNOWN, protected_resource, methods=["GET"]),
        Route(WELL_KNOWN + "/mcp", protected_resource, methods=["GET"]),
        *(console_routes() if config.console.enabled else []),  # first: two URLs are shared, by Accept
        *admin_routes(config.admin.token is not None),
    ]
    if config.metrics.token is not None or config.admin.token is not None:
        routes.append(Route("/metrics", scrape, methods=["GET"]))
    middleware = [Middleware(ErrorBoundary), Middleware(TransportGuard, config=config)]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
