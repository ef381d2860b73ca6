"""Which policy is active, and did the last bundle fail? OPA's status API, read by the gateway.

OPA's bundle plugin downloads and activates new revisions on its own (from a bundle
service, or from the bundle file the gateway serves it on loopback, to that OPA alone:
`BundleFileServer`); a bundle it rejects (bad signature, digest mismatch, compile error) leaves the previous
revision active and is reported only through its status API (`GET /v1/status`, enabled
by the status plugin). `PolicyStatus` polls that API and keeps what the operator needs:
the active revision, when it was activated, and the last error; the admin API
(`/admin/health`, `/admin/metrics`) and readiness read it from `Components.policy_status`.

Without the bundle plugin (a policy directory, or a bundle loaded once at start: OPA's status
then has no `bundles`, or there is no status API at all), the revision comes from
`/v1/data/system/bundles` (the manifests OPA loaded). A bundle without a revision (its manifest's
is "") has none: the revision is unknown.

Signatures authenticate a bundle; they do not order bundles: an older bundle, validly signed,
activates like a new one (a replayed file, a bundle service serving an old revision). OPA does the
activating; this reports it: each activation's manifest `built_at` (written by `pvegate bundle
build`, covered by the signature) is compared with the newest this gateway saw active for that
bundle, and an older one is a rollback, shown as the bundle's error (`/admin/health` degraded) and
in `pvegate_policy_bundle_rollback`, until a bundle at least as new is active again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.server
import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.policy.opa_address import httpx_async_client

log = logging.getLogger("pvegate.opa")

# Bundle activations PolicyStatus saw, per OPA address. OPA's provenance names a bundle by its
# revision alone, and the decision client keeps the data check per revision (decisions.py): with
# this count in its key, a bundle activated under a revision already checked (a name given twice
# with `--revision`) has its data checked again at the next decision once a status poll has seen
# the activation (before that, the health probe's forced check; docs/opa.md).
_activations: dict[str, int] = {}


def note_activation(url: str) -> None:
    """OPA at `url` activated a bundle: each decision client of it checks the policy data again."""
    key = url.rstrip("/")
    _activations[key] = _activations.get(key, 0) + 1


def activations_seen(url: str) -> int:
    return _activations.get(url.rstrip("/"), 0)


# --- the decision log's mask, again at each activation -------------------------------------------

# the decision log must never hold the tool arguments (passwords, keys): system.log.mask removes them
MASKED_PATH = "/input/arguments"
LOG_MASK_PATH = "/v1/data/system/log/mask"  # a GET: a query that carries no input
UNMASKED_REFUSAL = (
    "the active policy bundle's data.system.log.mask does not remove tool arguments; decision logs are on: "
    "refusing every call until a bundle with the mask is active"
)


def masks_arguments(mask: Any) -> bool:
    """Whether `data.system.log.mask` (OPA's answer: a list for the partial set) removes the tool
    arguments from decision logs: it holds "/input/arguments" (or all of "/input"), as a path or as
    a {"op": "remove", "path": ...} entry."""
    if not isinstance(mask, list):
        return False
    for entry in mask:
        path = entry.get("path") if isinstance(entry, dict) and entry.get("op", "remove") == "remove" else entry
        if path in (MASKED_PATH, "/input"):
            return True
    return False


def log_mask_answer(r: httpx.Response) -> bool:
    """Whether OPA's answer to GET LOG_MASK_PATH removes the tool arguments: the one reading of it, at
    a managed OPA's start (OPASidecar.check_log_mask) and at each bundle activation (LogMaskGuard).
    Raises httpx.HTTPError or ValueError when the answer is unusable (the callers fail closed)."""
    r.raise_for_status()
    body = r.json()
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    return masks_arguments(body.get("result"))


@dataclass
class LogMaskGuard:
    """Whether the OPA at one address may be sent a call's input, with its decision log on.

    OPA's bundle plugin activates a new bundle on its own: one without the mask (signed, but built
    elsewhere) would have every decision's arguments logged until the next restart. So each
    activation (seen by the status poll, or by a decision client's revision check, whichever first)
    has the mask asked again, and while it does not remove the arguments every query is refused
    before it is sent (DecisionClient.query)."""

    checked_for: int = -1  # the activation count (activations_seen) the mask was last asked at
    refusal: str | None = None

    def stale(self, url: str) -> bool:
        return self.checked_for != activations_seen(url)

    def record(self, masked: bool, activation: int) -> None:
        self.checked_for = activation
        if not masked and self.refusal is None:
            log.error("refusing every call: %s", UNMASKED_REFUSAL)
        elif masked and self.refusal is not None:
            log.warning(
                "the active policy bundle's data.system.log.mask removes tool arguments again: calls are decided again"
            )
        self.refusal = None if masked else UNMASKED_REFUSAL

    async def ask(self, url: str, client: httpx.AsyncClient, headers: dict[str, str] | None = None) -> str | None:
        """Ask OPA's mask now (no input sent) and record it; the refusal, or None. Raises httpx.HTTPError or
        ValueError when OPA gives no usable answer (nothing is recorded: the mask stays to be asked)."""
        activation = activations_seen(url)  # before the query: an activation during it is asked again
        self.record(log_mask_answer(await client.get(LOG_MASK_PATH, headers=headers or {})), activation)
        return self.refusal


# per OPA address: set by a managed OPA's start with decision logs on (console or upload)
_log_masks: dict[str, LogMaskGuard] = {}


def require_log_mask(url: str, activation: int) -> None:
    """The OPA at `url` logs decisions, and its mask removed the arguments at `activation` (its start's check)."""
    guard = _log_masks.setdefault(url.rstrip("/"), LogMaskGuard())
    guard.record(True, activation)


def log_mask_guard(url: str) -> LogMaskGuard | None:
    """The mask guard of the OPA at `url`, or None when its decisions are not logged (as far as the gateway knows)."""
    return _log_masks.get(url.rstrip("/"))


@dataclass
class BundleState:
    name: str
    revision: str | None = None
    activated_at: str | None = None  # OPA's RFC 3339 time of the last successful activation
    last_request_at: str | None = None
    error: str | None = None  # the latest attempt's error ("code: message"), None once one succeeds again
    last_error: str | None = None  # the most recent error seen, kept after recovery
    last_error_at: float | None = None  # when the gateway first saw last_error
    built_at: str | None = None  # the active bundle's manifest metadata.built_at (pvegate bundle build)
    newest_built_at: str | None = None  # the newest built_at seen active since the gateway started
    newest_revision: str | None = None  # the revision that had it
    rollback: str | None = None  # set while the active bundle was built before newest_built_at
    manifest: dict[str, Any] | None = field(default=None, repr=False)  # the last manifest read
    manifest_for: str | None = field(default=None, repr=False)  # the activation it was read for

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "revision": self.revision,
            "activated_at": self.activated_at,
            "built_at": self.built_at,
            "last_request_at": self.last_request_at,
            "error": self.error,
            "rollback": self.rollback,
            "last_error": self.last_error,
            "last_error_at": _iso(self.last_error_at),
        }

    def note_built_at(self, built_at: str | None) -> None:
        """The active bundle's build time: a rollback when older than the newest seen active."""
        self.built_at = built_at
        when = _parse_time(built_at)
        newest = _parse_time(self.newest_built_at)
        if when is None:  # not built by pvegate bundle build (or too old to say): no order known
            self.rollback = None
            return
        if newest is None or when >= newest:
            if self.rollback is not None:
                log.warning("bundle %s: revision %s is as new as any seen again", self.name, self.revision)
            self.newest_built_at, self.newest_revision, self.rollback = built_at, self.revision, None
            return
        rollback = (
            f"rollback: revision {self.revision or '(none)'} built {built_at} is active after revision "
            f"{self.newest_revision or '(none)'} built {self.newest_built_at} (an older bundle, validly "
            "signed: signatures do not order bundles)"
        )
        if rollback != self.rollback:
            log.error("bundle %s: %s", self.name, rollback)
            self.last_error, self.last_error_at = rollback, time.time()
        self.rollback = rollback


def _iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time as `pvegate bundle build` writes it (UTC, `Z`), or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


@dataclass
class PolicyStatus:
    """The policy OPA is deciding with, refreshed from OPA every `interval` seconds."""

    url: str
    source: str  # policies | bundle | bundle_file_watch | bundle_service | external
    token: str | None = None
    interval: float = 2.0
    bundles: dict[str, BundleState] = field(default_factory=dict)
    reachable: bool | None = None  # None: not asked yet
    checked_at: float | None = None
    problem: str | None = None  # why the last refresh failed
    _gone: dict[str, BundleState] = field(default_factory=dict, repr=False)  # bundles OPA stopped reporting

    @property
    def revision(self) -> str | None:
        """The active revision(s), as decision provenance names them (name@revision, joined)."""
        revs = [f"{n}@{b.revision}" for n, b in sorted(self.bundles.items()) if b.revision is not None]
        return ",".join(revs) or None

    @property
    def revision_known(self) -> bool:
        """A bundle revision is active (always true for a policy directory, which has none)."""
        if self.source == "policies":
            return bool(self.reachable)
        return bool(self.bundles) and all(b.revision is not None for b in self.bundles.values())

    @property
    def bundle_error(self) -> str | None:
        """OPA's refusal of the latest bundle, and a rollback to an older one (each bundle's)."""
        errs = [f"{n}: {e}" for n, b in sorted(self.bundles.items()) for e in (b.error, b.rollback) if e]
        return "; ".join(errs) or None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "revision": self.revision,
            "revision_known": self.revision_known,
            "error": self.bundle_error,
            "reachable": self.reachable,
            "checked_at": _iso(self.checked_at),
            "problem": self.problem,
            "bundles": [b.as_dict() for _, b in sorted(self.bundles.items())],
        }

    def prometheus(self) -> list[str]:
        """Metric lines (text format) for /admin/metrics."""
        lines = [
            "# HELP pvegate_policy_bundle_info The active bundle revision (value 1).",
            "# TYPE pvegate_policy_bundle_info gauge",
        ]
        for n, b in sorted(self.bundles.items()):
            lines.append(f'pvegate_policy_bundle_info{{name="{_esc(n)}",revision="{_esc(b.revision or "")}"}} 1')
        lines += [
            "# HELP pvegate_policy_bundle_error Whether the latest download or activation of the bundle failed.",
            "# TYPE pvegate_policy_bundle_error gauge",
        ]
        lines += [
            f'pvegate_policy_bundle_error{{name="{_esc(n)}"}} {int(bool(b.error))}' for n, b in self.bundles.items()
        ]
        lines += [
            "# HELP pvegate_policy_bundle_last_error_timestamp_seconds When the gateway last saw a bundle error.",
            "# TYPE pvegate_policy_bundle_last_error_timestamp_seconds gauge",
        ]
        lines += [
            f'pvegate_policy_bundle_last_error_timestamp_seconds{{name="{_esc(n)}"}} {b.last_error_at or 0}'
            for n, b in self.bundles.items()
        ]
        lines += [
            "# HELP pvegate_policy_bundle_rollback Whether the active bundle was built before one this gateway "
            "saw active earlier (an older bundle, validly signed, was activated).",
            "# TYPE pvegate_policy_bundle_rollback gauge",
        ]
        lines += [
            f'pvegate_policy_bundle_rollback{{name="{_esc(n)}"}} {int(bool(b.rollback))}'
            for n, b in sorted(self.bundles.items())
        ]
        lines += [
            "# HELP pvegate_policy_revision_known Whether the active policy revision is known.",
            "# TYPE pvegate_policy_revision_known gauge",
            f"pvegate_policy_revision_known {int(self.revision_known)}",
        ]
        return lines

    async def refresh(self, client: httpx.AsyncClient) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

        async def manifests() -> dict[str, Any]:
            r = await client.get("/v1/data/system/bundles", headers=headers)
            r.raise_for_status()
            loaded = r.json().get("result") or {}
            return loaded if isinstance(loaded, dict) else {}

        try:
            r = await client.get("/v1/status", headers=headers)
            status = (r.json().get("result") or {}).get("bundles") if r.status_code == 200 else None
            if status:  # the bundle plugin's status
                self._from_status(status)
                if any(b.activated_at != b.manifest_for for b in self.bundles.values()):
                    self._built_from(await manifests())  # an activation: its manifest says when it was built
            else:  # no status API, or no bundle plugin (a bundle loaded once): the loaded manifests
                self._from_manifests(await manifests())
            guard = log_mask_guard(self.url)
            if guard is not None and guard.stale(self.url):  # an activation with decision logs on: its mask
                await guard.ask(self.url, client, headers)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            self.reachable = False
            self.problem = f"OPA status unavailable: {type(exc).__name__}"
            return
        self.reachable = True
        self.problem = None
        self.checked_at = time.time()

    def _from_status(self, bundles: dict[str, Any]) -> bool:
        """Read the bundle plugin's status; True when a bundle activated since the last read."""
        activated = False
        for name, st in bundles.items():
            b = self._state(name)
            when = st.get("last_successful_activation")
            if not isinstance(when, str) or when.startswith("0001-"):
                # this OPA process activated no bundle (a restart whose bundle is refused or not yet
                # downloaded): no policy decides, whatever the previous process had active
                if b.revision is not None:
                    log.error("bundle %s: OPA has no active revision (revision %s is gone)", name, b.revision)
                b.revision, b.activated_at = None, None
            elif when != b.activated_at:
                # an activation: its revision, or none (OPA leaves out a bundle's empty revision)
                b.revision, b.activated_at, activated = st.get("active_revision") or None, when, True
            elif st.get("active_revision"):
                b.revision = st["active_revision"]
            b.last_request_at = st.get("last_request")
            err = None
            if st.get("code") or st.get("message") or st.get("errors"):
                detail = "; ".join(str(e.get("message", e)) for e in st.get("errors") or [] if isinstance(e, dict))
                err = f"{st.get('code', 'error')}: {st.get('message', '')}" + (f" ({detail})" if detail else "")
            if err is not None and err != b.error:
                kept = f"revision {b.revision} stays active" if b.revision is not None else "no revision is active"
                log.error("OPA refused bundle %s (%s): %s", name, kept, err)
                b.last_error, b.last_error_at = err, time.time()
            elif err is None and b.error is not None:
                log.warning("bundle %s activates again: revision %s", name, b.revision)
            b.error = err
        activated = self._forget_all_but(bundles) or activated
        if activated:  # a revision reused by the new bundle must not keep the old data check
            note_activation(self.url)
        return activated

    def _forget_all_but(self, names: dict[str, Any]) -> bool:
        """Drop the bundles OPA no longer reports (renamed or removed in its configuration, or an OPA
        restarted with none): their revisions decide nothing now and must not be named as if they did."""
        gone = [n for n in self.bundles if n not in names]
        for name in gone:
            b = self.bundles.pop(name)
            log.warning("bundle %s: OPA no longer reports it (revision %s)", name, b.revision)
            # kept aside with the newest build seen, so a name that comes back with an older bundle is a rollback
            b.revision = b.activated_at = b.manifest = b.manifest_for = None
            self._gone[name] = b
        return bool(gone)

    def _state(self, name: str) -> BundleState:
        if name not in self.bundles:
            self.bundles[name] = self._gone.pop(name) if name in self._gone else BundleState(name)
        return self.bundles[name]

    def _built_from(self, loaded: dict[str, Any]) -> None:
        """Each activated bundle's build time, from the manifest OPA keeps for it."""
        for name, b in self.bundles.items():
            if b.activated_at != b.manifest_for:  # (a bundle OPA keeps no manifest for: read once all the same)
                b.manifest = (loaded.get(name) or {}).get("manifest") or {}
                b.manifest_for = b.activated_at
                b.note_built_at(_built_at(b.manifest))

    def _from_manifests(self, loaded: dict[str, Any]) -> None:
        # named as OPA names the bundle (for a bundle loaded once: the path it was given), as its
        # decisions' provenance names it, so `revision` is the audit's bundle_revision
        if self._forget_all_but(loaded):
            note_activation(self.url)
        for name, doc in loaded.items():
            b = self._state(name)
            manifest = (doc or {}).get("manifest") or {}
            revision = manifest.get("revision")
            b.revision = revision if isinstance(revision, str) and revision else None  # "": none
            if manifest != b.manifest:
                if b.manifest is not None:  # another bundle than at the last read
                    note_activation(self.url)
                b.manifest = manifest
                b.note_built_at(_built_at(manifest))

    async def refresh_once(self) -> None:
        async with httpx_async_client(self.url, timeout=2.0) as client:
            await self.refresh(client)

    async def run(self) -> None:
        async with httpx_async_client(self.url, timeout=2.0) as client:
            while True:
                await asyncio.sleep(self.interval)
                await self.refresh(client)


def _built_at(manifest: dict[str, Any]) -> str | None:
    meta = manifest.get("metadata")
    built = meta.get("built_at") if isinstance(meta, dict) else None
    return built if isinstance(built, str) else None


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _BoundedHTTPServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server with at most `limit` connections that have not shown the token yet. When
    that many wait, a new connection closes the oldest of them (OPA's own request shows the token in its
    first packet: a connection still waiting for it after others came is not OPA's), so no local process
    can crowd out OPA's poll with connections it keeps half-open, nor take threads of the gateway without
    bound (twice the limit at most, while closed ones wind down)."""

    def __init__(self, address: tuple[str, int], handler: Any, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._count = 0  # connections with a thread
        self._waiting: dict[Any, float] = {}  # those that have not shown the token: when each came
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if self._count >= self._limit and self._waiting:
                oldest = min(self._waiting, key=self._waiting.__getitem__)
                del self._waiting[oldest]
                with contextlib.suppress(OSError):  # its handler's read ends; its thread frees its place
                    oldest.shutdown(socket.SHUT_RDWR)
            if self._count >= 2 * self._limit:  # all shown the token, or still winding down: no more threads
                self.shutdown_request(request)
                return
            self._count += 1
            self._waiting[request] = time.monotonic()
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started
            self._gone(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._gone(request)

    def _gone(self, request: Any) -> None:
        with self._lock:
            self._count -= 1
            self._waiting.pop(request, None)

    def admitted(self, request: Any) -> None:
        """The connection showed the token: it is OPA's, and never closed to make room."""
        with self._lock:
            self._waiting.pop(request, None)


class BundleFileServer:
    """Serves one bundle file to OPA's bundle plugin on 127.0.0.1, read afresh on every request.

    OPA polls it like any bundle service, so a new file activates without a restart, and
    verifies its signature like any downloaded bundle. The ETag (the file's SHA-256) lets
    OPA skip an unchanged file.

    Only the OPA that was given `token` gets the file: a loopback port is open to every local
    process (another container in the network namespace, a browser through DNS rebinding, a
    request forged through a local HTTP client), and OPA's REST client cannot reach a Unix
    socket (Go's transport: `unsupported protocol scheme "unix"`). So a request must name this
    server as its Host (403 otherwise: a rebinding browser sends its own host name) and carry
    `Authorization: Bearer <token>` (401 otherwise). The token is random, replaced by
    `new_token()` for each OPA start, handed to OPA only in its private configuration file
    (the service's `credentials.bearer`), and never logged, neither here nor by OPA (which
    masks the Authorization header even at debug level).

    Each connection is a thread of the gateway's process, and any local process can open them: one
    that sends nothing for `idle_timeout` seconds (mid-request, or idle between requests) is closed,
    and once `max_connections` have not shown the token, a new one closes the oldest of them
    (_BoundedHTTPServer): no local client can hold threads of the gateway without end, nor keep
    OPA's poll out by holding connections half-open.
    """

    resource = "bundle.tar.gz"
    max_connections = 16  # waiting for their token at once; OPA's shows it at once

    def __init__(self, path: Path) -> None:
        self.path = path
        self._token = secrets.token_urlsafe(32)
        self.idle_timeout = 10.0  # seconds a connection may stay silent
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def setup(self) -> None:
                super().setup()
                self.connection.settimeout(server.idle_timeout)  # every read and write of the connection

            def _refuse(self, code: int) -> None:
                self.send_response(code)
                if code == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="pvegate-bundle-file"')
                self.send_header("Content-Length", "0")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

            def do_GET(self) -> None:
                if self.headers.get("Host") != server.host:
                    self._refuse(403)
                    return
                if not server.authorized(self.headers.get("Authorization")):
                    self._refuse(401)
                    return
                server._server.admitted(self.connection)
                if self.path.split("?")[0] != "/" + BundleFileServer.resource:
                    self.send_error(404)
                    return
                try:
                    data = server.path.read_bytes()
                except OSError:
                    self.send_error(404, "bundle file missing")
                    return
                etag = '"' + hashlib.sha256(data).hexdigest() + '"'
                if self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/gzip")
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return  # OPA's own status reports what matters; the request line is not logged either

        self._server = _BoundedHTTPServer(("127.0.0.1", 0), Handler, self.max_connections)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="pvegate-bundle-file")

    def __repr__(self) -> str:  # never the token
        return f"BundleFileServer({self.url}, {str(self.path)!r})"

    @property
    def host(self) -> str:
        """The only Host header accepted: the one OPA sends for `url`."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def new_token(self) -> str:
        """A fresh bearer token for the OPA about to start; the previous one stops working."""
        self._token = secrets.token_urlsafe(32)
        return self._token

    def credentials(self) -> dict[str, Any]:
        """OPA's service `credentials` section carrying the current token (for its private config file only)."""
        return {"bearer": {"token": self._token, "scheme": "Bearer"}}

    def authorized(self, header: str | None) -> bool:
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self._token.encode())

    def start(self) -> BundleFileServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
        self._server.server_close()
