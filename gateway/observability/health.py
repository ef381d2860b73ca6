"""Liveness and readiness that tell the truth, from background probes.

/livez says the process answers. /readyz (and its alias /healthz) is green only when
a load balancer may send agents here:

- opa: a real decision came back recently. A prober asks the decision entrypoint
  (data.pvegate.decision) with a fixed, contract-valid probe input through the same
  client as live calls, so the answer passes the same timeout and the same schema
  check. A stopped (SIGSTOP), slow, unreachable or garbage-answering OPA turns this
  red at the next probe; a prober that stops probing turns it red by age.
- policy: the active policy revision is known: the bundle revision from the
  decision's provenance, or, for a policy directory, the SHA-256 over the policy
  files the managed OPA loaded at its last (re)start (`files:<12 hex>`).
- audit: the audit store takes writes: no failed commit since the last good one, a
  commit (real, or a probe that writes outside the hash chain) recently, and free
  space on its file system above a floor. The probe fails as a commit of records would
  (a row past the authenticated head too), and calls refused for the store now
  (Outcomes.store_problem: records kept in the outbox, a write failed moments ago) make
  it red as well: never ready while every call is refused. Both follow the calls, not only
  the probe: a call refused for a failing store (PostgreSQL unreachable in a quota or
  approval step, before any audit write) turns it red at once, until a commit succeeds
  again; a commit after a failed probe (the first call served once PostgreSQL is back)
  turns it green without waiting for the next probe.
- identity: with `auth.jwks_url` (and no HS256 accepted), the gateway holds a signing key from it: with
  none (the provider down or the URL wrong since the start, a JWKS without a usable key) every token is
  refused, so not ready. While
  unready for it, a probe asks the key cache to fetch (gateway/auth/jwks.py: one fetch at a time, at most
  one per min_refresh_seconds, shared with tokens naming unknown keys), so keys load without traffic.
  Keys once held stay trusted while the provider is down (docs/identity.md): still ready, the failed
  fetch shown in /admin/health only. Static keys (the HS256 secret, auth.jwks_file) have no such check.
- draining: the gateway is not shutting down.
- reconcile: the reconciler's background task (gateway/store/reconcile.py) still runs. Calls
  it leaves open (a Proxmox down, a task still running) do not make the gateway unready: they
  are the work it keeps doing, shown with its last pass; a task that died settles nothing more.

Proxmox reachability per cluster is probed too and reported (and counted in
metrics), but never makes the gateway unready: one cluster down must not take the
gateway away from agents working on the others, and a deny is still an answer.

The endpoints read cached state: a load balancer polling them costs nothing, and
no probe is ever triggered by an unauthenticated request.

Two views of the same checks. /readyz takes no credential, so it shows the gateway's own words
only (`checks()`, `readiness()`): the text of an exception or of OPA (a database's host, port, role
or file path, a bundle server's URL) is left out, its type named at most, with "details in
/admin/health"; the policy data's problems (rule paths, tools, arguments) are counted, not listed.
GET /admin/health (admin token) asks for the private view (`private=True`), with that text and those lists.
The verdict, the status code and the check names are the same in both.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.core.config import HealthConfig
from gateway.policy.bundle_status import log_mask_guard
from gateway.policy.catalog_refs import catalog_problems
from gateway.policy.decisions import PolicyError
from gateway.policy.opa_guard import opa_is_open_async, open_access_message
from gateway.tools.targets import unknown_target

if TYPE_CHECKING:
    from gateway.auth.jwks import JwksKeys
    from gateway.observability.metrics import Metrics
    from gateway.policy.bundle_status import BundleState, PolicyStatus
    from gateway.policy.decisions import DecisionClient
    from gateway.policy.opa_sidecar import OPASidecar
    from gateway.store.audit import AuditLog
    from gateway.store.outcomes import Outcomes
    from gateway.store.reconcile import Reconciler
    from gateway.tools.catalog import Catalog
    from gateway.tools.runtimes.pve_api import PveApiClient

log = logging.getLogger("pvegate.health")

PROBE_SUB = "pvegate-readiness-probe"
PROBE_TOOL = "pvegate_readiness_probe"
_FAIL_PREFIX = "denied: policy decision unavailable ("
STOP_WAIT_SECONDS = 2.0  # per round of cancelling the probe loops at shutdown
# how often the identity probe looks whether keys are missing; the key cache's rate limit bounds the fetches
IDENTITY_PROBE_INTERVAL = 1.0
DETAILS = "details in /admin/health"  # where /readyz sends its reader for the text it leaves out
# the refusal of an external OPA that answers without a token names its address (opa_guard): not on /readyz
_OPEN_OPA = re.compile(r"\S*".join(re.escape(part) for part in open_access_message("\x00").split("\x00")))
_OPEN_OPA_PUBLIC = open_access_message(f"(its address: {DETAILS})")


def probe_input(now_ns: int | None = None) -> dict[str, Any]:
    """The fixed input of the OPA readiness probe: a well-formed call (decision_input.schema.json)
    by a principal with no roles, for a read-only tool no catalog declares. Any decision inside the
    contract proves OPA evaluates the real policy; the policy denies it, and nothing is dispatched."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    now = datetime.fromtimestamp(now_ns / 1e9, tz=UTC)
    counters = {"1m": 0, "1h": 0, "24h": 0}
    return {
        "contract_version": 1,
        "kind": "call",
        "principal": {
            "sub": PROBE_SUB,
            "iss": "pvegate",
            "client_id": None,
            "roles": [],
            "groups": [],
            "scopes": [],
            "kind": "service",
        },
        "request": {
            "id": "readiness-probe",
            "method": "tools/call",
            "protocol_version": None,
            "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "time_ns": now_ns,
            "weekday": now.strftime("%a"),
            "hour_utc": now.hour,
            "source_ip": None,
        },
        "tool": {
            "name": PROBE_TOOL,
            "title": "gateway readiness probe",
            "connector": "pve_api",
            "domain": "cluster",
            "effect": "read",
            "tags": [],
            "scope": "cluster",
        },
        "arguments": {},
        "arguments_digest": "sha256:" + "0" * 64,
        "target": unknown_target(None),  # the same unknown target a live call would send
        "approval": None,
        "usage": {"tool": dict(counters), "all": dict(counters)},
        "dry_run": False,
    }


def _iso(wall: float | None) -> str | None:
    return None if wall is None else datetime.fromtimestamp(wall, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(mono: float | None, now: float) -> float | None:
    return None if mono is None else round(now - mono, 3)


@dataclass
class ClusterState:
    state: str = "unknown"  # unknown | ok | unreachable | unauthorized | error
    detail: str | None = None
    public_detail: str | None = None  # the same for /readyz: no exception text (a host and port, a file path)
    checked_at: float | None = None  # monotonic
    ok_at: float | None = None
    latency_ms: float | None = None


@dataclass
class HealthMonitor:
    """Background probes and the readiness verdict built from them."""

    config: HealthConfig
    decisions: DecisionClient
    audit: AuditLog
    metrics: Metrics
    sidecar: OPASidecar | None = None
    clusters: dict[str, PveApiClient] = field(default_factory=dict)
    # OPA's bundle plugin status (policy/bundle_status.py): a refused bundle and the last error
    policy_status: PolicyStatus | None = None
    # the same floor below which calls are refused (audit.min_free_mb): one number, so a gateway
    # never reports ready while it refuses every call, nor unready while it serves them
    audit_min_free_bytes: int = 16 * 1024 * 1024
    # opa.mode external: asked each OPA probe whether it answers without a token (policy/opa_guard.py)
    external_opa_url: str | None = None
    bundle_signed: bool | None = None  # app.bundle_signed: False only under opa.allow_unsigned
    draining: bool = False  # set by graceful shutdown: unready first, so the balancer moves away
    # the outcome reconciler, attached once its task runs (app.py); None: no `reconcile` check
    reconciler: Reconciler | None = None
    # auth.jwks_url's key cache, the authenticator's own (app.py); None, or one on a file: no `identity` check
    jwks: JwksKeys | None = None
    # what refuses calls for the audit store (Outcomes.store_problem), attached with the components
    # (components.py): the audit check is red while it refuses them
    outcomes: Outcomes | None = None
    # OPA probe
    opa_ok_at: float | None = None  # monotonic time of the last decision inside the contract
    opa_error: str | None = "not probed yet"
    opa_latency_ms: float | None = None
    revision: str | None = None
    revision_source: str | None = None  # bundle | files
    revision_since: float | None = None  # wall time this gateway first saw the current revision
    data_check_error: str | None = None  # the last data check got no usable answer
    # the served tool catalog: the policy data's references to it are checked once per revision
    # (policy/catalog_refs.py); what they name that it lacks is reported, and refuses no call
    catalog: Catalog | None = None
    catalog_problems: tuple[str, ...] | None = None
    catalog_check_error: str | None = None
    # audit probe
    audit_probe_error: str | None = None
    audit_probe_public: str | None = None  # the same for /readyz: the exception's type, not its text
    # monotonic time the probe failed; a commit after it (a call's records) clears a refusal at once. Not a
    # timeout (audit_probe_timed_out): the timed-out probe's own write may still commit, slowly
    audit_probe_failed_at: float | None = None
    audit_probe_timed_out: bool = False
    audit_free_bytes: int | None = None
    audit_stat_error: str | None = None
    # the audit file removed or replaced under the running gateway (AuditLog.file_problem), logged once
    audit_file_problem: str | None = None
    # the audit probe's failure and the free-space check's, as last logged: a failure is logged when it starts
    # or changes, its end once, not on every probe round (17,000 lines a day at the default interval)
    _audit_logged: str | None = field(default=None, repr=False)
    _stat_logged: str | None = field(default=None, repr=False)
    cluster_states: dict[str, ClusterState] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.cluster_states = {name: ClusterState() for name in self.clusters}

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """One round of OPA and audit probes before serving (so readiness is known at once), then loops."""
        await asyncio.gather(self.probe_opa(), self.probe_audit(), self.probe_identity())
        self._tasks = [
            asyncio.create_task(self._loop(self.probe_opa, self.config.opa_probe_interval), name="health-opa"),
            asyncio.create_task(self._loop(self.probe_audit, self.config.audit_probe_interval), name="health-audit"),
        ]
        if self._identity_keys() is not None:
            self._tasks.append(
                asyncio.create_task(self._loop(self.probe_identity, IDENTITY_PROBE_INTERVAL), name="health-identity")
            )
        if self.clusters and self.config.cluster_probe_interval > 0:
            self._tasks.append(
                asyncio.create_task(
                    self._loop(self.probe_clusters, self.config.cluster_probe_interval, first=0.0),
                    name="health-clusters",
                )
            )

    async def stop(self) -> None:
        """Cancel the probe loops and wait for them, boundedly: a probe that ignores its cancellation
        must not hold up the shutdown (it is cancelled again, then left behind with a warning)."""
        tasks, self._tasks = self._tasks, []
        for _ in range(3):
            pending = [t for t in tasks if not t.done()]
            if not pending:
                break
            for t in pending:
                t.cancel()
            await asyncio.wait(pending, timeout=STOP_WAIT_SECONDS)
        for t in tasks:
            if not t.done():
                log.warning("health probe task %s did not stop when cancelled; left behind", t.get_name())
            elif not t.cancelled() and t.exception() is not None:
                log.warning("health probe task %s had failed: %r", t.get_name(), t.exception())

    async def _loop(self, probe: Any, interval: float, first: float | None = None) -> None:
        await asyncio.sleep(interval if first is None else first)
        while True:
            try:
                await probe()
            except Exception:  # a probe bug must not end the probing (readiness would go stale: red)
                log.exception("health probe %s failed", getattr(probe, "__name__", probe))
            await asyncio.sleep(interval)

    # --- probes ------------------------------------------------------------------------

    async def probe_opa(self) -> None:
        if self.external_opa_url is not None:
            await self.guard_external_opa(self.external_opa_url)
        started = time.perf_counter()
        decision = await self.decisions.decide(probe_input())
        took = time.perf_counter() - started
        self.metrics.opa_probe_seconds.observe(took)
        if decision.failed_closed:
            reason = decision.deny[0] if decision.deny else "no decision"
            if reason.startswith(_FAIL_PREFIX) and reason.endswith(")"):
                reason = reason[len(_FAIL_PREFIX) : -1]
            if self.opa_error is None and reason != self._log_mask_refusal():  # (that one is logged once)
                log.error("readiness: OPA gave no usable decision (%s)", reason)
            self.opa_error = reason
            self.metrics.opa_probe_failures_total.inc()
            return
        if self.opa_error is not None and self.opa_ok_at is not None:
            log.warning("readiness: OPA answers again")
        self.opa_ok_at = time.monotonic()
        self.opa_error = None
        self.opa_latency_ms = round(took * 1000, 3)
        # a bundle without a revision has none (decision.revision is None): unknown, not `name@`
        revision, source = decision.revision, "bundle"
        if revision is None and self.sidecar is not None and not self.sidecar.bundle_mode:
            revision, source = self.sidecar.policy_revision, "files"
        # the data check again (decisions ask it once per revision): data changed without a new
        # revision (an external OPA's data API) shows here within one probe interval
        try:
            await self.decisions.check_data(self.decisions.revision_key(decision.revision), force=True)
            self.data_check_error = None
        except PolicyError as exc:
            self.data_check_error = f"policy data check unavailable: {exc}"
        if revision != self.revision or self.catalog_check_error is not None:
            await self._check_catalog_references()
        if revision != self.revision:
            if self.revision is not None:
                log.warning("policy revision changed: %s -> %s", self.revision, revision)
            self.revision, self.revision_source, self.revision_since = revision, source, time.time()

    async def _check_catalog_references(self) -> None:
        """The policy data's tool names, tags and arguments the served catalog lacks (a misspelled
        `node_rebot` silently drops its control): asked of the policy once per revision, logged and
        listed in /admin/health (counted on /readyz). Not a refusal: a bundle may serve other catalogs too."""
        if self.catalog is None:
            return
        try:
            found = await catalog_problems(self.decisions, self.catalog)
        except PolicyError as exc:
            self.catalog_check_error = f"catalog check unavailable: {exc}"
            return
        self.catalog_check_error = None
        if found and found != self.catalog_problems:
            for problem in found:
                log.warning("policy data names what the tool catalog lacks: %s", problem)
        self.catalog_problems = found

    async def guard_external_opa(self, url: str) -> None:
        """Refuse every decision while the external OPA answers without a token (checked at start too)."""
        is_open = await opa_is_open_async(url)
        if is_open is None:
            return  # unreachable: the decision probe below reports that, and calls fail closed anyway
        refusal = open_access_message(url) if is_open else None
        if refusal != self.decisions.refusal:
            if refusal:
                log.error("refusing every call: %s", refusal)
            else:
                log.warning("the OPA at %s requires a token again: calls are decided again", url)
            self.decisions.refusal = refusal

    def _identity_keys(self) -> JwksKeys | None:
        """The key cache the `identity` check watches: one fetched from auth.jwks_url, else None."""
        return self.jwks if self.jwks is not None and self.jwks.url is not None else None

    async def probe_identity(self) -> None:
        """While auth.jwks_url has given no signing key, a fetch through the key cache's own refresh: one at a
        time, at most one per min_refresh_seconds (shared with tokens naming unknown keys, so probing adds no
        fetch storm), waited for at most its timeout. So a gateway unready for want of keys loads them without
        traffic. With keys held it fetches nothing: refreshing them is the tokens' business, as before."""
        keys = self._identity_keys()
        if keys is None or keys.key_count:
            return
        await keys.refresh(force=True)

    async def probe_audit(self) -> None:
        """A committed write when nothing else committed lately; the free space of the store's file system."""
        local = self.audit.local_dir  # None on PostgreSQL: its disk is the server's (a failed write says so)
        try:
            st = None if local is None else await asyncio.to_thread(os.statvfs, local)
            self.audit_free_bytes = None if st is None else st.f_bavail * st.f_frsize
            self.audit_stat_error = None
        except OSError as exc:
            # calls are refused on the same failure (Outcomes.store_problem): not ready either (the
            # directory renamed or removed, unsearchable for the service's user, a stale NFS handle)
            self.audit_free_bytes = None
            self.audit_stat_error = f"cannot check the audit store's free space ({exc.strerror or exc})"
        if self.audit_stat_error != self._stat_logged:
            if self.audit_stat_error:
                log.error("readiness: %s", self.audit_stat_error)
            else:
                log.warning("readiness: the audit store's free space can be checked again")
            self._stat_logged = self.audit_stat_error
        if local is not None:  # before the probe's write, which it makes fail: the cause is named, not the effect
            problem = await self._audit_file_problem()
            if problem is not None and problem != self.audit_file_problem:  # logged once, not every probe
                log.error("readiness: %s", problem)
            self.audit_file_problem = problem  # shown before any other audit detail (status)
        last = self.audit.last_commit_at
        if (
            last is not None
            and time.monotonic() - last < self.config.audit_probe_interval
            and not self.audit.last_error
            and self._call_refused_at() is None  # a call met the store failing since: that needs a probe
        ):
            self._probe_ok()
            return  # real traffic committed recently: that is the proof
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the task's cancellation
            # when the probe finishes at that moment, and stop() then waited for this loop forever
            async with asyncio.timeout(self.config.audit_probe_timeout):
                await self.audit.probe()
            self._probe_ok()
        except TimeoutError:
            self.audit_probe_error = f"audit store did not commit within {self.config.audit_probe_timeout:g} s"
            self.audit_probe_public = self.audit_probe_error
            self.audit_probe_failed_at, self.audit_probe_timed_out = time.monotonic(), True
        except Exception as exc:
            self.audit_probe_error = f"audit store refuses writes ({_describe(exc)})"
            self.audit_probe_public = f"audit store refuses writes ({type(exc).__name__}; {DETAILS})"
            self.audit_probe_failed_at, self.audit_probe_timed_out = time.monotonic(), False
        if self.audit_probe_error and self.audit_probe_error != self._audit_logged:
            log.error("readiness: %s", self.audit_probe_error)
            self._audit_logged = self.audit_probe_error

    async def _audit_file_problem(self) -> str | None:
        """Why the SQLite file at audit.path is not the one the gateway writes (removed, renamed, replaced),
        or None: the audit's own check (AuditLog.file_problem), which calls are refused on too."""
        return await asyncio.to_thread(self.audit.file_problem)

    def _probe_ok(self) -> None:
        if self._audit_logged is not None:
            log.warning("readiness: the audit store takes writes again")
            self._audit_logged = None
        self.audit_probe_error = self.audit_probe_public = None
        self.audit_probe_failed_at, self.audit_probe_timed_out = None, False

    def _probe_error_stands(self) -> bool:
        """The last audit probe failed, and nothing committed since: a commit after a probe the store refused
        (a call's records, once PostgreSQL is back) proves the store takes writes again, without waiting for
        the next probe. A timed-out probe is cleared by the next probe only: its own write may still commit."""
        if not self.audit_probe_error:
            return False
        last, failed = self.audit.last_commit_at, self.audit_probe_failed_at
        if self.audit_probe_timed_out or last is None or failed is None:
            return True
        return last <= failed

    def _call_refused_at(self) -> float | None:
        """When a call was last refused for a failing store (Outcomes.store_failed: PostgreSQL unreachable in
        the quota, approval or hold store before any audit write, an audit write that failed), if nothing
        committed since: readiness stays red from the refusal on until a commit (a call's records, or the
        probe's) succeeds, however long the probe interval. None when there is none, or a commit followed."""
        outcomes = self.outcomes
        if outcomes is None or outcomes.last_store_error is None:
            return None
        failed = outcomes.store_error_at
        last = self.audit.last_commit_at
        return failed if last is None or last < failed else None

    async def probe_clusters(self) -> None:
        await asyncio.gather(*(self._probe_cluster(name, client) for name, client in self.clusters.items()))

    async def _probe_cluster(self, name: str, client: PveApiClient) -> None:
        st = self.cluster_states.setdefault(name, ClusterState())
        started = time.perf_counter()
        detail: str | None
        public: str | None = None  # the same as detail, unless that carries an exception's text
        try:
            async with asyncio.timeout(client.cluster.timeout + 1):  # not wait_for: see probe_audit
                status = await client.ping()
        except (TimeoutError, httpx.TimeoutException):
            state, detail = "unreachable", "no answer in time"
        except Exception as exc:  # connection refused, TLS or pin mismatch, DNS
            state, detail = "unreachable", _describe(exc)
            # an UpstreamError names the API's host and port, and why: its cause only (unreachable, tls)
            cause = getattr(exc, "cause", None)
            public = f"{cause if isinstance(cause, str) else type(exc).__name__} ({DETAILS})"
        else:
            if 200 <= status < 300:
                state, detail = "ok", None
            elif status == 401:
                state, detail = "unauthorized", "Proxmox rejected the gateway's API token"
            elif status == 403:
                state, detail = "unauthorized", "the gateway's API token may not read /version"
            else:
                state, detail = "error", f"Proxmox answered HTTP {status}"
        now = time.monotonic()
        if state != st.state and st.state != "unknown":
            log.warning("cluster %s: %s -> %s%s", name, st.state, state, f" ({detail})" if detail else "")
        st.state, st.detail, st.public_detail, st.checked_at = state, detail, public or detail, now
        st.latency_ms = round((time.perf_counter() - started) * 1000, 3)
        if state == "ok":
            st.ok_at = now
        self.metrics.cluster_probes_total.labels(name, state).inc()

    # --- verdict -----------------------------------------------------------------------

    def checks(self, private: bool = False) -> dict[str, dict[str, Any]]:
        """Each check: `ok`, `detail` (why not, None when ok) and its figures. The public view (/readyz, the
        default) says why in the gateway's own words only; `private` (/admin/health) adds the text of the
        exception or of OPA behind it. `ok` is the same in both."""
        now = time.monotonic()
        cfg = self.config
        opa_age = _age(self.opa_ok_at, now)
        opa_fresh = opa_age is not None and opa_age <= cfg.opa_max_age
        if self.opa_error is not None:
            opa_detail: str | None = self.opa_error if private else _OPEN_OPA.sub(_OPEN_OPA_PUBLIC, self.opa_error)
        elif not opa_fresh:
            opa_detail = f"no decision from OPA for {opa_age:.1f} s (probe stalled)" if opa_age else "not probed yet"
        else:
            opa_detail = None
        opa = {
            "ok": opa_detail is None,
            "detail": opa_detail,
            "last_decision_age_seconds": opa_age,
            "latency_ms": self.opa_latency_ms,
        }
        data = self.decisions.data_check
        policy_detail: str | None
        if (unmasked := self._log_mask_refusal()) is not None:
            # every call is refused unsent (decisions.py), at once: not only from the next probe on
            policy_detail = unmasked
        elif self.revision is None:
            if self.opa_ok_at is None:
                policy_detail = "unknown until OPA answers"
            elif self.sidecar is not None and self.sidecar.bundle_mode:
                policy_detail = "the active bundle has no revision (`pvegate bundle build` gives every bundle one)"
            else:
                policy_detail = "OPA reports no bundle revision (an external OPA must serve a bundle)"
        elif self.data_check_error is not None:
            policy_detail = self.data_check_error if private else f"policy data check unavailable ({DETAILS})"
        elif data is not None and not data.valid:
            # the policy's own data check names the keys, rules, tools and arguments at fault: policy
            # internals, for the authenticated view only; /readyz counts them
            n = len(data.problems)
            shown = "; ".join(data.problems) if private else f"{n} problem{'' if n == 1 else 's'} ({DETAILS})"
            policy_detail = f"policy data invalid, every call is refused: {shown}"
        else:
            policy_detail = None
        policy: dict[str, Any] = {
            "ok": policy_detail is None,
            "detail": policy_detail,
            "revision": self.revision,
            "source": self.revision_source,
            "since": _iso(self.revision_since),
            "data_valid": None if data is None else data.valid,
            # None: not checked (no catalog, an older policy without the check, or OPA gave no answer). They
            # name the policy's rule paths, tools and arguments: listed in the private view, counted on /readyz
            "catalog_problems": (
                None
                if self.catalog_problems is None
                else list(self.catalog_problems)
                if private
                else len(self.catalog_problems)
            ),
        }
        if self.bundle_signed is not None:
            policy["signature_checked"] = self.bundle_signed
        if self.policy_status is not None and self.policy_status.bundles:
            # a refused bundle leaves the previous revision deciding: still ready, but it shows here
            st = self.policy_status
            if private:
                policy["bundle_error"] = st.bundle_error
                policy["bundles"] = [b.as_dict() for _, b in sorted(st.bundles.items())]
            else:  # OPA's error text may name the bundle server's URL: that there is one, and which bundle
                policy["bundle_error"] = _public_bundle_error(st)
                policy["bundles"] = [_public_bundle(b) for _, b in sorted(st.bundles.items())]
        commit_age = _age(self.audit.last_commit_at, now)
        refused = None if self.outcomes is None else self.outcomes.store_problem(check_space=False)
        if self.audit_file_problem:  # its own words (no path), before the failed writes it explains
            audit_detail: str | None = self.audit_file_problem
        elif self.audit.last_error:
            # "Type: text" (AuditLog._commit): the text of a database's error may name its host, role or file
            shown = self.audit.last_error if private else _with_details(_type_of(self.audit.last_error))
            audit_detail = f"audit store refuses writes ({shown})"
        elif self._probe_error_stands():
            audit_detail = self.audit_probe_error
            if not private:
                audit_detail = self.audit_probe_public or f"audit store refuses writes ({DETAILS})"
        elif refused is not None:
            if private or (self.outcomes is not None and self.outcomes.outbox):  # records waiting: a count
                audit_detail = f"calls are refused: {refused}"
            else:  # the store's error text (Outcomes.store_failed)
                audit_detail = f"calls are refused: the last audit write failed ({DETAILS})"
        elif (refused_at := self._call_refused_at()) is not None:
            ago = f"{now - refused_at:.1f} s ago"
            if private and self.outcomes is not None:
                audit_detail = (
                    f"a call was refused for the store {ago}, and nothing has committed since "
                    f"({self.outcomes.last_store_error})"
                )
            else:  # the store's error text may name its host, role or file
                audit_detail = f"a call was refused for the store {ago}, and nothing has committed since ({DETAILS})"
        elif self.audit_stat_error:
            audit_detail = self.audit_stat_error  # the OS's error string, never the path
        elif commit_age is None or commit_age > cfg.audit_max_age:
            audit_detail = "no audit commit recently (probe stalled)" if commit_age else "not probed yet"
        elif self.audit_free_bytes is not None and self.audit_free_bytes < self.audit_min_free_bytes:
            audit_detail = (
                f"{self.audit_free_bytes} bytes free on the audit store's file system "
                f"(floor {self.audit_min_free_bytes}, audit.min_free_mb)"
            )
        else:
            audit_detail = None
        audit = {
            "ok": audit_detail is None,
            "detail": audit_detail,
            "last_commit_age_seconds": commit_age,
            "free_bytes": self.audit_free_bytes,
        }
        draining = {"ok": not self.draining, "detail": "shutting down" if self.draining else None}
        checks: dict[str, dict[str, Any]] = {"opa": opa, "policy": policy, "audit": audit, "draining": draining}
        if self.reconciler is not None:
            r = self.reconciler
            dead = r.task_error()
            checks["reconcile"] = {
                "ok": dead is None,
                "detail": dead if private or dead is None else _public_task_error(r, dead),
                "last_pass_age_seconds": None if r.last_pass_at is None else round(time.time() - r.last_pass_at, 3),
                "open_calls": r.open_calls(),
            }
        if (keys := self._identity_keys()) is not None:
            checks["identity"] = self._identity_check(keys, now, private)
        return checks

    def _identity_check(self, keys: JwksKeys, now: float, private: bool) -> dict[str, Any]:
        """No signing key from auth.jwks_url: every token is refused (401), so not ready. The failed fetch
        in the gateway's words or by the exception's type (/readyz), with its text (private); with keys held
        a failed fetch refuses nothing (they stay trusted) and shows in the private view only."""
        failure = keys.failure
        if failure is not None and keys.failure_detail is not None:
            failure += f": {keys.failure_detail}" if private else f"; {DETAILS}"
        detail: str | None = None
        if keys.key_count:
            pass
        elif failure is not None:
            detail = f"no signing key loaded from auth.jwks_url (last fetch failed: {failure})"
        elif keys.loaded_at is not None:  # it answered, with no key we can use (all skipped, or none)
            detail = "the JWKS at auth.jwks_url holds no usable signing key"
        else:
            detail = "no signing key loaded from auth.jwks_url yet"
        check: dict[str, Any] = {
            "ok": detail is None,
            "detail": detail,
            "keys": keys.key_count,
            "loaded_age_seconds": _age(keys.loaded_at, now),
        }
        if private:
            check["last_fetch_error"] = failure
        return check

    def _log_mask_refusal(self) -> str | None:
        """Why every call is refused unsent while the managed OPA logs decisions and its active bundle's
        mask does not remove the tool arguments (bundle_status.LogMaskGuard), or None."""
        guard = None if self.sidecar is None else log_mask_guard(self.sidecar.url)
        return None if guard is None else guard.refusal

    def clusters_view(self, private: bool = False) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        return {
            name: {
                "state": st.state,
                "detail": st.detail if private else st.public_detail,
                "checked_age_seconds": _age(st.checked_at, now),
                "latency_ms": st.latency_ms,
            }
            for name, st in self.cluster_states.items()
        }

    def readiness(self, private: bool = False) -> tuple[bool, dict[str, Any]]:
        """The verdict and its document: /readyz's (public) or, with `private`, /admin/health's."""
        checks = self.checks(private)
        reasons = [f"{name}: {c['detail']}" for name, c in checks.items() if not c["ok"]]
        ready = not reasons
        doc = {
            "status": "ready" if ready else "unready",
            "reasons": reasons,
            "checks": checks,
            "clusters": self.clusters_view(private),
        }
        return ready, doc

    def collect(self) -> Iterator[Metric]:
        """Scrape-time gauges: readiness, each check, the policy revision, cluster reachability."""
        checks = self.checks()
        ready = GaugeMetricFamily("pvegate_ready", "1 when /readyz is green (every check ok).")
        ready.add_metric([], int(all(c["ok"] for c in checks.values())))
        yield ready
        check = GaugeMetricFamily(
            "pvegate_health_check_ok", "Each readiness check (1 ok, 0 failing).", labels=["check"]
        )
        for name, c in checks.items():
            check.add_metric([name], int(c["ok"]))
        yield check
        if self.opa_ok_at is not None:
            age = GaugeMetricFamily(
                "pvegate_opa_last_decision_age_seconds", "Seconds since the readiness probe got a valid decision."
            )
            age.add_metric([], time.monotonic() - self.opa_ok_at)
            yield age
        if self.revision is not None:
            info = GaugeMetricFamily(
                "pvegate_opa_policy_revision_info",
                "The active policy revision (bundle or files).",
                labels=["revision", "source"],
            )
            info.add_metric([self.revision, self.revision_source or ""], 1)
            yield info
            since = GaugeMetricFamily(
                "pvegate_opa_policy_activated_timestamp_seconds",
                "Unix time this gateway first saw OPA decide with the active revision.",
            )
            since.add_metric([], self.revision_since or 0)
            yield since
        if self.policy_status is not None and self.policy_status.bundles:
            err = GaugeMetricFamily(
                "pvegate_opa_bundle_error",
                "1 while OPA refuses the latest download or activation of the bundle (the previous one stays active).",
                labels=["name"],
            )
            for name, b in sorted(self.policy_status.bundles.items()):
                err.add_metric([name], int(bool(b.error)))
            yield err
        if self.audit_free_bytes is not None:
            free = GaugeMetricFamily("pvegate_audit_free_bytes", "Free bytes on the audit store's file system.")
            free.add_metric([], self.audit_free_bytes)
            yield free
        up = GaugeMetricFamily(
            "pvegate_cluster_up",
            "1 when the cluster's API answered the last probe with the gateway's token (no sample before one).",
            labels=["cluster"],
        )
        state = GaugeMetricFamily(
            "pvegate_cluster_state",
            "The cluster's last probe state (1 for the current one).",
            labels=["cluster", "state"],
        )
        for name, st in self.cluster_states.items():
            if st.state != "unknown":  # not probed (yet, or cluster_probe_interval 0): neither up nor down
                up.add_metric([name], int(st.state == "ok"))
            for s in ("unknown", "ok", "unreachable", "unauthorized", "error"):
                state.add_metric([name, s], int(st.state == s))
        yield up
        yield state
        if self.reconciler is not None:
            r = self.reconciler
            yield GaugeMetricFamily(
                "pvegate_reconcile_last_pass_timestamp_seconds",
                "Unix time the outcome reconciler last finished a round without an error (0: not yet).",
                value=r.last_pass_at or 0,
            )
            yield GaugeMetricFamily(
                "pvegate_reconcile_open_calls",
                "Allowed calls without a recorded outcome that the reconciler still tries to settle (NaN: unknown, "
                "its pass over earlier runs fails).",
                value=float("nan") if (n := r.open_calls()) is None else n,
            )


def _describe(exc: BaseException) -> str:
    """An exception as an operator reads it, never with a secret: our own messages, or the type."""
    from gateway.store.audit import AuditClosed
    from gateway.tools.runtimes.base import ToolError

    if isinstance(exc, ToolError | AuditClosed):
        return str(exc)
    if isinstance(exc, OSError | httpx.HTTPError):
        return type(exc).__name__
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text and len(text) < 200 else type(exc).__name__


def _type_of(text: str) -> str | None:
    """The exception type that leads an error text ("OperationalError: unable to open ...", as
    AuditLog.last_error keeps it), or None when no type name leads it."""
    head, sep, _ = text.partition(":")
    return head if sep and head.isidentifier() else None


def _with_details(kind: str | None) -> str:
    return f"{kind}; {DETAILS}" if kind else DETAILS


def _public_task_error(reconciler: Reconciler, dead: str) -> str:
    """Reconciler.task_error() for /readyz: the exception that ended the task by its type, not its text."""
    task = reconciler.task
    if task is None or not task.done() or task.cancelled() or task.exception() is None:
        return dead  # cancelled, ended: the gateway's own words
    return f"the reconciler task died ({_with_details(type(task.exception()).__name__)})"


def _public_bundle_error(status: PolicyStatus) -> str | None:
    """PolicyStatus.bundle_error without OPA's text (it may name the bundle server's URL): each bundle
    whose latest download or activation OPA refused, or that is older than one active before."""
    errs = [
        f"{name}: {what}"
        for name, b in sorted(status.bundles.items())
        for what in (
            "OPA refused the latest bundle" if b.error else None,
            "an older bundle is active again (rollback)" if b.rollback else None,
        )
        if what
    ]
    return f"{'; '.join(errs)} ({DETAILS})" if errs else None


def _public_bundle(b: BundleState) -> dict[str, Any]:
    """BundleState.as_dict() for /readyz: whether there is an error or a rollback, not OPA's text of it."""
    doc = b.as_dict()
    doc["error"], doc["rollback"] = bool(b.error), bool(b.rollback)
    del doc["last_error"]
    return doc
