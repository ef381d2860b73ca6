"""Running the gateway under uvicorn, with TLS unless plain HTTP was asked for on loopback.

A gateway that cannot start says why in one line, before it starts anything: `serve` runs
`preflight` (secrets readable, state directory writable, TLS files loadable, the port free)
before it starts OPA, and turns whatever still fails while the components are built (OPA
refusing its bundle, the audit database) into a StartupError whose message is the reason.
The CLI prints it; the traceback goes to the debug log only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import re
import signal
import socket
import sqlite3
import ssl
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import asyncssh
import uvicorn
from starlette.applications import Starlette

from gateway.admin.console.session import Sessions
from gateway.app import build_components, create_app, external_opa_token
from gateway.auth.tokens import Authenticator
from gateway.components import Components
from gateway.core.config import Config, ConfigError, LocalPrincipal, SecretRef, service_secret_refs
from gateway.core.config_schema import is_loopback
from gateway.mcp.stdio import local_principal, serve_stdio
from gateway.mcp.wellknown import token_resource
from gateway.policy.opa_sidecar import OPAUnavailable
from gateway.store.audit import AuditIntegrityError
from gateway.store.audit_seal import AuditKeyError
from gateway.store.backend import AuditInUse, hold_sqlite_audit, refuse_unshared
from gateway.store.db import DatabaseUnavailable
from gateway.store.holds import MemoryHolds
from gateway.store.outcomes import Outcomes
from gateway.store.reconcile import Reconciler
from gateway.store.shared_keys import configured_key
from gateway.tools.catalog import CatalogError

log = logging.getLogger("pvegate")
HS256_MIN_BYTES = 32  # RFC 7518 §3.2: an HS256 key at least as long as the hash


class StartupError(Exception):
    """The gateway cannot start; str() is the one-line reason an operator reads."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def check_state_dir(path: Path, setting: str = "state_dir") -> None:
    """Create the directory if needed and prove a file can be written in it.

    A write probe rather than a mode check: the gateway often runs as root, which
    ignores permission bits but not a read-only filesystem or a path through a file.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".pvegate-write-check-"):
            pass
    except OSError as exc:
        raise StartupError(f"{setting} {path} is not a writable directory: {_reason(exc)}") from exc


def _read_at_check(config: Config) -> list[SecretRef]:
    """The secrets check_secrets reads (each must be there and not empty)."""
    refs: list[SecretRef] = [c.token for c in config.clusters.values()]
    # metrics.token too: otherwise first read at the first scrape, and a mistyped path only ever answers 401
    refs += [r for r in (config.auth.hs256_secret, config.admin.token, config.metrics.token) if r is not None]
    refs += service_secret_refs(config.opa.services)  # OPA's service credentials given as {file:} or {env:}
    console = config.console
    if console.enabled:  # read once OPA runs and the audit is open: a bad one must not get that far
        refs += [r for r in (console.session_key, console.client_secret) if r is not None]
    return refs


def secret_refs(config: Config) -> list[SecretRef]:
    """Every secret `pvegate serve` reads at start: check_secrets's, the state key, the database's password
    and an external OPA's token (`pvegate config check --files` looks each up without reading it)."""
    refs = _read_at_check(config)
    refs += [r for r in (config.state_key, config.storage.password) if r is not None]
    if config.opa.mode == "external" and config.opa.token is not None:
        refs.append(config.opa.token)
    return refs


def check_secrets(config: Config) -> None:
    for ref in secret_refs(config):  # docs/deployment.md §4: readable by the gateway's user alone
        if (exposed := ref.exposed()) is not None:
            log.warning("%s", exposed)
    for ref in _read_at_check(config):
        try:
            if not ref.read():
                raise StartupError(f"{ref.setting}: the secret is empty")
        except ConfigError as exc:
            raise StartupError(str(exc)) from exc
    check_secret_strength(config)


# a Proxmox API token as the gateway sends it (`Authorization: PVEAPIToken=<this>`): USER@REALM!TOKENID=SECRET,
# a user name as PVE admits it (PVE::Auth::Plugin: no blank, ':' or '/'; '@', '!', '=' allowed, e.g. an email
# address in an LDAP or OpenID realm), the realm and the token id as pveum makes them
_PVE_TOKEN = re.compile(r"[^\s:/]+@[A-Za-z][A-Za-z0-9._-]*![A-Za-z][A-Za-z0-9._-]*=\S+")


def check_secret_strength(config: Config) -> None:
    """The secrets whose form serve's start checks, read (each must be readable): each cluster's
    Proxmox token, and the keys that must be long enough (the HS256 secret, the state key, the
    console's session key). `pvegate config check --files` runs it too, so a secret serve refuses
    is never said OK there."""
    for cluster in config.clusters.values():
        try:
            token = cluster.token.read()
        except ConfigError as exc:
            raise StartupError(str(exc)) from exc
        prefixed = token.startswith("PVEAPIToken=")  # the header's own prefix: the user part would admit it
        if prefixed or not _PVE_TOKEN.fullmatch(token):  # its shape only: the token is never shown
            hint = " (without the `PVEAPIToken=` prefix)" if prefixed else ""
            raise StartupError(
                f"{cluster.token.setting}: not a Proxmox API token: one line, USER@REALM!TOKENID=SECRET{hint}, "
                "as `pveum user token add` prints it (the secret is not shown)"
            )
    console = config.console
    hs256 = config.auth.hs256_secret
    try:
        size = len(hs256.read().encode()) if hs256 is not None else HS256_MIN_BYTES
        configured_key(config)  # present and long enough (the database's key is read at start)
    except ConfigError as exc:
        raise StartupError(str(exc)) from exc
    if hs256 is not None and size < HS256_MIN_BYTES:
        # a short HMAC key is guessed offline from any one token it signed (RFC 7518 §3.2: at least 256 bits)
        raise StartupError(
            f"{hs256.setting}: the secret is {size} bytes; an HS256 secret needs at least "
            f"{HS256_MIN_BYTES} (e.g. `openssl rand -base64 48`)"
        )
    if console.enabled and console.session_key is not None:
        try:  # long enough: the console's own check, as the start-up will make it
            Sessions(console.session_key.read(), console.idle_timeout_seconds, console.max_session_seconds)
        except ValueError as exc:
            raise StartupError(str(exc)) from None


def check_opa(config: Config) -> None:
    """An external OPA's URL and API token: OPA's API must admit the gateway alone (docs/deployment.md)."""
    if config.opa.mode != "external":
        return
    if not config.opa.url:
        raise StartupError("opa.mode external needs opa.url")
    try:
        external_opa_token(config)
    except ConfigError as exc:
        raise StartupError(str(exc)) from exc


def check_files(config: Config) -> None:
    """Files the gateway reads at start-up or on the first call: present and readable now."""
    files: list[tuple[str, Path | None]] = [
        ("auth.jwks_file", config.auth.jwks_file),
        ("opa.bundle", config.opa.bundle),
        ("opa.verification_key", config.opa.verification_key),
        *((f"clusters.{c.name}.ca_file", c.ca_file) for c in config.clusters.values()),
        *((f"clusters.{c.name}.ssh.key_file", c.ssh.key_file if c.ssh else None) for c in config.clusters.values()),
    ]
    for setting, path in files:
        if path is None:
            continue
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise StartupError(f"{setting}: cannot read {path}: {_reason(exc)}") from exc
    if not config.connectors_dir.is_dir():
        raise StartupError(f"connectors_dir {config.connectors_dir} is not a directory")


def check_ssh_keys(config: Config) -> None:
    """The SSH private key usable without a passphrase (the gateway has none to give) and private to
    the gateway's user, and each node's pinned host key a public key: else every SSH call would fail,
    each with an error."""
    for c in config.clusters.values():
        if c.ssh is None:
            continue
        try:
            asyncssh.read_private_key(str(c.ssh.key_file))
        except (OSError, ValueError, asyncssh.Error) as exc:  # KeyImportError: no key, or one needing a passphrase
            raise StartupError(
                f"clusters.{c.name}.ssh.key_file: {c.ssh.key_file} is no usable private key: {exc}"
            ) from None
        for n in c.ssh.nodes.values():
            try:
                asyncssh.import_public_key(n.host_key)
            except (ValueError, asyncssh.Error) as exc:
                raise StartupError(
                    f"clusters.{c.name}.ssh.nodes.{n.name}.host_key: not an OpenSSH public key: {exc}"
                ) from None
        # it logs in to every node: held to the audit head key's rule (store/audit_seal.py), owner only
        mode = c.ssh.key_file.stat().st_mode  # readable: read_private_key above opened it
        if mode & 0o077:
            raise StartupError(
                f"clusters.{c.name}.ssh.key_file: {c.ssh.key_file} is readable or writable by other users "
                f"(mode {stat.S_IMODE(mode):o}): chmod 600 it"
            )


class _EncryptedKey(Exception):
    """OpenSSL asked for the TLS key's passphrase."""


def _no_passphrase() -> bytes:
    # without a callback OpenSSL prompts on the controlling terminal, and the start waits there for input
    raise _EncryptedKey


def check_tls(config: Config) -> None:
    if config.tls.insecure_http or not (config.tls.cert and config.tls.key):
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            config.tls.cert, config.tls.key, password=_no_passphrase
        )
    except _EncryptedKey:
        # uvicorn is given no passphrase either: it would prompt, or fail, in its turn
        raise StartupError(
            f"tls.key: {config.tls.key} is encrypted: pvegate has no passphrase to give; store it decrypted (mode 0600)"
        ) from None
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(
            f"tls.cert/tls.key: cannot load {config.tls.cert} and {config.tls.key}: {_reason(exc)}"
        ) from exc


def bind(config: Config) -> socket.socket:
    """The listening socket, bound now so that a port in use is reported before OPA starts."""
    try:
        infos = socket.getaddrinfo(config.host, config.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise StartupError(f"listen.host: cannot resolve {config.host}: {_reason(exc)}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"listen: cannot listen on {config.host}:{config.port}: {_reason(exc)}") from exc
    return sock


def preflight(config: Config, *, listener: bool = True) -> None:
    """Everything that can be checked without starting anything; StartupError names the first problem.
    `listener=False` (`pvegate stdio`): no TLS files are needed."""
    try:
        refuse_unshared(config)
    except ConfigError as exc:
        raise StartupError(str(exc)) from exc
    check_state_dir(config.state_dir)
    check_state_dir(config.audit_path.parent, "audit.path: the directory")
    check_secrets(config)
    check_opa(config)
    check_files(config)
    check_ssh_keys(config)
    if listener:
        check_tls(config)


@contextlib.contextmanager
def single_writer(config: Config) -> Generator[None, None, None]:
    """On SQLite, this process's exclusive hold on the audit file for as long as it serves, taken
    before anything starts: a second gateway on the same file would take the first one's calls in
    flight for a crashed run's and settle them (Reconciler.read_earlier), and reap its OPA."""
    try:
        held = hold_sqlite_audit(config)
    except AuditInUse as exc:
        raise StartupError(str(exc)) from None
    except OSError as exc:
        raise StartupError(f"audit database: cannot lock {exc.filename or config.audit_path}: {_reason(exc)}") from exc
    try:
        yield
    finally:
        if held is not None:
            held.close()


def describe(exc: BaseException) -> str:
    """The one-line reason for an exception raised while the components were built."""
    if isinstance(exc, StartupError):
        return str(exc)
    if isinstance(exc, OPAUnavailable):
        return str(exc)  # each says "OPA ..." or "no opa binary ..."
    if isinstance(exc, CatalogError):
        return f"connectors: {exc}"
    if isinstance(exc, sqlite3.Error | AuditIntegrityError):
        return f"audit database: {exc}"
    if isinstance(exc, DatabaseUnavailable):
        return f"storage.url: {exc}"
    if isinstance(exc, AuditKeyError):
        return f"audit.head_key_file: {exc}"
    if isinstance(exc, ConfigError):
        return "; ".join(exc.problems)
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {_reason(exc)}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def uvicorn_config(
    config: Config, app: Starlette | None = None, lifespan: Literal["on", "off"] = "on"
) -> uvicorn.Config:
    """`lifespan="off"`: the caller runs the application's lifespan itself (`pvegate serve`)."""
    tls: dict[str, str] = {}
    if config.tls.insecure_http:
        if not is_loopback(config.host):
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
        lifespan=lifespan,
        # after the drain (DrainingServer) only idle keep-alive connections are left to close
        timeout_graceful_shutdown=5,
        # json: uvicorn's own loggers reach the root handler (one JSON object per line), not its formatter
        log_config=None if config.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        # uvicorn believes X-Forwarded-For from loopback by default: a local client could then
        # choose the source address the audit and the policy see. Only configured proxies count.
        proxy_headers=bool(config.trusted_proxies),
        forwarded_allow_ips=list(config.trusted_proxies) or None,
        **tls,  # type: ignore[arg-type]
    )


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class DrainingServer(uvicorn.Server):
    """uvicorn, with a drain on SIGTERM/SIGINT/SIGHUP before its own shutdown.

    First signal: `draining` is set at once (new calls get 503 with Retry-After, readiness
    is red), calls in flight get `shutdown_grace_seconds` to finish, the rest are cut off and
    recorded as `interrupted`; then uvicorn shuts down. A second signal cuts off at once.
    SIGHUP (a closed terminal, a supervisor's "reload") stops the gateway as SIGTERM does: there is
    nothing to reload in place, and its default action would kill the process without the drain.
    """

    _loop: asyncio.AbstractEventLoop | None = None
    _drain: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    @property
    def handled_signals(self) -> list[int]:
        """The signals it handled, in order: re-raised by `serve` once everything is closed."""
        return list(self._captured_signals)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's, with SIGHUP as well, and without its re-raising the signals handled at the end:
        the components are still open then (`pvegate serve` closes them after uvicorn's shutdown)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        app = self.config.app
        components = getattr(app.state, "components", None) if isinstance(app, Starlette) else None
        if components is None or self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)  # not serving yet, or already shutting down: uvicorn's way
            return
        self._captured_signals.append(sig)  # re-raised by uvicorn once it has shut down, as it does
        outcomes = components.outcomes
        if outcomes.draining:  # a second signal: stop waiting
            self._loop.call_soon_threadsafe(outcomes.cut)
            return
        outcomes.draining = True  # set in the handler itself: no request slips in before the task runs
        if components.health is not None:
            components.health.draining = True  # /readyz red at once: the balancer moves away
        self._loop.call_soon_threadsafe(self._start_drain, outcomes)

    def _start_drain(self, outcomes: Outcomes) -> None:
        async def drain() -> None:
            try:
                await outcomes.drain()
            finally:
                self.should_exit = True

        self._drain = asyncio.create_task(drain(), name="drain")


def serve_stdio_for(config: Config, principal: str) -> None:
    """`pvegate stdio`: the gateway for one local principal on stdin/stdout, no listener.

    The same components as `serve` (OPA sidecar, audit, approvals); StartupError (one line,
    on stderr: stdout is the protocol's) when the principal is unknown or a part cannot start.
    """
    local = config.local_principals.get(principal)
    if local is None:
        known = ", ".join(sorted(config.local_principals)) or "none are configured"
        raise StartupError(f"--principal {principal}: not a local_principals entry ({known})")
    preflight(config, listener=False)
    with single_writer(config):
        asyncio.run(_stdio(config, local))


async def _stdio(config: Config, local: LocalPrincipal) -> None:
    """The stdio gateway's life: the start-up (a stop signal during it cancels it: what had started is
    stopped, StartupError), then serving until the end of input or a stop signal (SIGTERM, SIGINT, SIGHUP:
    no more input is read, the calls running get `shutdown_grace_seconds`, a second signal cuts them off
    at once), then OPA and the audit closed. As under `pvegate serve`, what earlier runs left open is
    read before the first call and settled from Proxmox in the background (Reconciler)."""
    started_at = time.time()  # calls decided before this are earlier runs' to reconcile
    loop = asyncio.get_running_loop()
    # the build in a task of its own: a signal cancels it, never this task (a cancellation that came
    # as the build ended would be delivered later, in the middle of the shutdown)
    building = asyncio.create_task(build_components(config), name="start-up")
    stop = asyncio.Event()
    received: list[int] = []
    components: Components | None = None

    def on_signal(sig: int) -> None:
        received.append(sig)
        if components is None:  # still starting: the start-up is cancelled (start_sidecar stops OPA)
            building.cancel()
        elif len(received) > 1:  # a second signal: stop waiting for the calls running
            components.outcomes.cut()
        else:
            log.warning("pvegate stdio: %s received: stopping", signal.Signals(sig).name)
            stop.set()

    for sig in STOP_SIGNALS:  # not their default actions: OPA (in its own session) would outlive us
        loop.add_signal_handler(sig, on_signal, sig)
    tasks: list[asyncio.Task[None]] = []
    try:
        try:
            components = await building
        except asyncio.CancelledError:
            if not received:
                raise
            name = signal.Signals(received[0]).name
            raise StartupError(f"stopped by {name} during start-up (what had started was stopped)") from None
        except Exception as exc:
            raise StartupError(describe(exc)) from exc
        if received:  # it came as the build ended: stop as if it came now
            stop.set()
        try:
            if components.sidecar:
                tasks.append(asyncio.create_task(components.sidecar.supervise()))
            components.outcomes.start()  # records kept while the audit store was full are written when it takes them
            # what earlier runs left open (killed, cut off): read before the first call, settled in the background
            reconciler = Reconciler(config, components.catalog, components.outcomes, components.clients)
            own_holds = components.holds if isinstance(components.holds, MemoryHolds) else None
            await reconciler.read_earlier(started_at, own_holds)
            tasks.append(reconciler.start(started_at))
            log.info("pvegate stdio ready for %s: %d tools, OPA at %s", local.name, len(components.catalog),
                     components.decisions.url)  # fmt: skip
            await serve_stdio(components, local_principal(local), stop=stop)
            if received:
                log.info("pvegate stdio stopped by %s", signal.Signals(received[0]).name)
        finally:
            for task in tasks:
                task.cancel()
                # a task that died already (its error was logged) must not keep OPA and the audit open
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await components.close()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_OPERATOR_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def keep_freed_heap(trim_mib: int = 64, mmap_mib: int = 16) -> bool:
    """Keep the pages a large response frees for the next one, on glibc; True when set.

    A tools/list answer over a big catalog is ~0.5 MiB built and copied a few times per request. glibc
    gives the freed top of its heap back to the kernel once it exceeds the trim threshold, so each
    listing faulted ~3 MiB of fresh pages back in (~800 minor faults; 4.6 against 1.8 ms p50 for a
    cached listing of 659 tools, docs/performance.md). Set, both are fixed: buffers under `mmap_mib`
    come from the heap, and up to `trim_mib` of its free top stays mapped (RSS may keep that much).
    An operator's own MALLOC_* or GLIBC_TUNABLES settings win; on other C libraries, nothing is done."""
    if any(name in os.environ for name in _OPERATOR_MALLOC_SETTINGS[:-1]) or "glibc.malloc." in os.environ.get(
        "GLIBC_TUNABLES", ""
    ):  # the operator's own malloc settings (GLIBC_TUNABLES also carries others: glibc.pthread.rseq=0)
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # the mmap threshold first: setting either one stops glibc adjusting the other dynamically
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_mib << 20) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_mib << 20) == 1)


def freeze_startup_heap() -> None:
    """Move what start-up built (the catalog, both PVE API schemas, validators, the policy view: most
    of the heap) out of the cyclic collector's sight. Left in, every full collection walks it: 60-126 ms
    pauses of the event loop every 20-30 s under load, each one a p99 spike for every call in flight
    (docs/performance.md). What start-up built lives as long as the process, so nothing is lost."""
    gc.collect()
    gc.freeze()


class StopSignals:
    """SIGTERM, SIGINT and SIGHUP for the whole of `pvegate serve`, from before OPA starts.

    Python's default actions end the process on the spot: OPA (in its own session) and its
    directories left behind, nothing drained. Here the first of them during the start-up (OPA
    starting, the audit opening, ...) cancels the start-up: what was built is stopped and the
    gateway exits with a one-line reason (StartupError). Once the server is there, the signals
    are its own (DrainingServer: the drain); what it handled is re-raised when everything is
    closed, as uvicorn does, so that a supervisor sees the gateway stopped by the signal it sent.
    """

    def __init__(self) -> None:
        self.received: int | None = None  # the first one during the start-up
        self.server: DrainingServer | None = None  # set once the start-up is done
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def starting(self) -> None:
        """In the task that starts the gateway: a signal from now on cancels it."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        if self.received is not None:  # it came before the event loop ran
            self._loop.call_soon(self._cancel)

    def serving(self, server: DrainingServer) -> None:
        """The start-up is done (a cancellation not yet delivered is dropped): the server's from now on."""
        self.server = server
        if self.received is not None:  # it came as the start-up ended
            raise self.interrupted()

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        if self.server is not None:  # before uvicorn has taken the signals over, or after it gave them back
            self.server.handle_exit(sig, frame)
        elif self.received is None:  # a second one while the start-up is undone: that is under way
            self.received = sig
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self.server is None and self._task is not None:
            self._task.cancel()

    def interrupted(self) -> StartupError:
        name = signal.Signals(self.received).name if self.received is not None else "a signal"
        return StartupError(f"stopped by {name} during start-up (what had started was stopped)")

    def reraise(self) -> None:
        """The signals the server handled, re-raised with their default action (uvicorn's way, but
        now that the components are closed): the last one received ends the process."""
        for sig in reversed(self.server.handled_signals if self.server is not None else []):
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)


def serve(config: Config) -> None:
    """Run the gateway until it is stopped; StartupError (one line: why) if it cannot start.

    The components are built, and the application's lifespan entered, here, before uvicorn
    serves: a failure is an exception we can describe (with everything started so far stopped)
    rather than uvicorn's traceback. SIGTERM, SIGINT or SIGHUP during all this stops the
    start-up cleanly (StopSignals); once serving, they drain (DrainingServer).
    """
    preflight(config)
    keep_freed_heap()
    with single_writer(config):
        sock = bind(config)
        signals = StopSignals()
        try:
            with signals:
                asyncio.run(_serve(config, sock, signals))
        finally:
            sock.close()
    signals.reraise()


async def _serve(config: Config, sock: socket.socket, signals: StopSignals) -> None:
    signals.starting()
    async with contextlib.AsyncExitStack() as stack:
        try:
            authenticator = Authenticator(config.auth, resource=token_resource(config))
            components = await build_components(config)
            app = create_app(config, components, authenticator)
            # the start-up work after the build; when it fails, the lifespan closes the components
            await stack.enter_async_context(app.router.lifespan_context(app))
        except asyncio.CancelledError:
            if signals.received is None:
                raise
            raise signals.interrupted() from None
        except Exception as exc:
            raise StartupError(describe(exc)) from exc  # the CLI logs the traceback at debug level
        server = DrainingServer(uvicorn_config(config, app, lifespan="off"))
        signals.serving(server)
        freeze_startup_heap()
        await server.serve(sockets=[sock])
