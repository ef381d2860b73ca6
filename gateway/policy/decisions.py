"""The decision client: one OPA query per call, and fail closed on any doubt.

OPA unreachable, slower than the timeout, non-200, an undefined result, or a
result outside the decision schema all become a deny with a reason that says so.
The REST client is opa-python-client (aiohttp underneath), chosen by measurement:
against the same OPA and input it answered at a lower p50 than plain httpx
(bench/opa_client_latency.py; numbers in docs/opa.md). It runs with retries off,
so a failing OPA is a fast deny rather than a slow one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

import aiohttp
import fastjsonschema
import httpx
import jsonschema
from opa_client.opa_async import AsyncOpaClient

from gateway.core.jsonenc import holds_encoded, splice
from gateway.policy.bundle_status import UNMASKED_REFUSAL, LogMaskGuard, activations_seen, log_mask_guard
from gateway.policy.opa_address import aiohttp_connector, http_base, httpx_async_client

CONTRACT_VERSION = 1
DECISION_PATH = "pvegate/decision"
# the policy data's check, asked once per policy revision (not on every call: docs/policy-contract.md)
DATA_CHECK_PATH = "pvegate/data_check"
VISIBLE_TOOLS_PATH = "pvegate/visible_tools"
APPROVER_PATH = "pvegate/approver/decision"
CONSOLE_PATH = "pvegate/console/sections"
# the code of a deny the gateway makes when OPA gave no usable answer
FAIL_CLOSED_CODE = "policy.unavailable"
_QUERY_PARAMS = {"provenance": "true", "metrics": "true"}


log = logging.getLogger("pvegate.policy")


def _load_schema(name: str) -> dict[str, Any]:
    text = resources.files("gateway.schemas").joinpath(name).read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@dataclass(frozen=True)
class Unanswered:
    """Why the policy gave no usable answer to a question with nothing to refuse (nothing is opened)."""

    reason: str


@dataclass(frozen=True)
class Decision:
    """What OPA answered for one call (or the deny that stands in for no answer)."""

    allow: bool
    deny: tuple[str, ...]
    # the deny reasons with their stable codes: {code, rule, message} (docs/policy-contract.md)
    deny_reasons: tuple[dict[str, str], ...] = ()
    risk: dict[str, Any] = field(default_factory=dict)
    approval: dict[str, Any] = field(default_factory=dict)
    obligations: dict[str, Any] = field(default_factory=dict)
    quota: dict[str, Any] | None = None
    decision_id: str | None = None
    revision: str | None = None  # the bundle(s) OPA's provenance names: None for a policy directory
    eval_ns: int | None = None
    failed_closed: bool = False
    # what the audit names: `revision`, or the managed sidecar's policy files ("files:<digest>")
    policy_revision: str | None = None

    @property
    def approval_required(self) -> bool:
        return (
            not self.allow
            and not self.deny
            and bool(self.approval.get("required"))
            and not self.approval.get("satisfied")
        )

    @property
    def deny_codes(self) -> list[str]:
        """The stable codes of the deny reasons, sorted and unique."""
        return sorted({r["code"] for r in self.deny_reasons})

    @property
    def approval_codes(self) -> list[str]:
        """The stable codes of the reasons an approval is required."""
        return sorted({r["code"] for r in self.approval.get("reasons") or ()})

    def as_dict(self) -> dict[str, Any]:
        """The decision as the audit, the console's what-if and `pvegate policy eval` show it."""
        return {
            "allow": self.allow,
            "deny": list(self.deny),
            "deny_codes": self.deny_codes,
            "deny_reasons": list(self.deny_reasons),
            "risk": self.risk,
            "approval": self.approval,
            "obligations": self.obligations,
            "quota": self.quota,
            "decision_id": self.decision_id,
            "bundle_revision": self.policy_revision or self.revision,
            "failed_closed": self.failed_closed,
        }

    @classmethod
    def from_result(cls, result: dict[str, Any], envelope: dict[str, Any], revision: str | None = None) -> Decision:
        """The decision a contract-valid result stands for (also what `pvegate policy replay` compares)."""
        metrics = envelope.get("metrics") or {}
        return cls(
            # defence in depth against a policy bug: a deny reason, or an unmet approval, always wins
            allow=bool(result["allow"])
            and not result["deny"]
            and not ((result.get("approval") or {}).get("required") and not result["approval"].get("satisfied")),
            deny=tuple(result["deny"]),
            deny_reasons=tuple(result.get("deny_reasons") or ()),
            risk=result.get("risk") or {},
            approval=result.get("approval") or {},
            obligations=result.get("obligations") or {},
            quota=result.get("quota"),
            decision_id=envelope.get("decision_id"),
            revision=revision,
            eval_ns=metrics.get("timer_rego_query_eval_ns"),
        )

    @classmethod
    def fail_closed(cls, reason: str) -> Decision:
        message = f"denied: policy decision unavailable ({reason})"
        coded = {"code": FAIL_CLOSED_CODE, "rule": "gateway.policy.decisions", "message": message}
        return cls(allow=False, deny=(message,), deny_reasons=(coded,), failed_closed=True)


@dataclass(frozen=True)
class DataCheck:
    """The policy data's verdict for one policy revision (`data.pvegate.data_check`)."""

    revision: str | None
    valid: bool
    problems: tuple[str, ...] = ()
    refusal: Decision | None = None  # the answer to every call while the data is invalid
    checked_at: float = 0.0  # time.monotonic()


class ApproverVerdict(NamedTuple):
    allowed: bool
    reasons: list[str]
    decision_id: str | None
    groups: list[str]  # the request's approver groups this approver qualified through
    codes: tuple[str, ...] = ()  # the stable codes of the reasons (docs/policy-contract.md)
    step_up_max_age: int | None = None  # voting needs an authentication no older than this (seconds)


class PolicyError(Exception):
    """OPA gave no usable answer; the message is safe to show to a client."""


def read_data_check(
    result: Any, contract_problem: Callable[[Any], str | None]
) -> tuple[tuple[str, ...], dict[str, Any] | None]:
    """The policy's data check (`data.pvegate.data_check`) as the gateway reads it: (problems, None)
    when the data is valid, (problems, refusal) when it is not, the refusal being the decision that
    then answers every call. The one reading of it: the decision client and `pvegate policy replay`
    both use it. `contract_problem` is DecisionClient.contract_problem.

    Raises PolicyError when the check is unusable (the caller fails closed): not an object with a
    boolean `valid` and a `problems` list of strings, or, for invalid data, a refusal that breaks
    the decision contract or allows."""
    if not isinstance(result, dict) or not isinstance(result.get("valid"), bool):
        raise PolicyError("data check does not match the contract")
    problems = result.get("problems")
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        raise PolicyError("data check does not match the contract")
    if result["valid"]:
        return tuple(problems), None
    refusal = result.get("refusal")
    if contract_problem(refusal) is not None or not isinstance(refusal, dict) or refusal.get("allow"):
        raise PolicyError("data check refusal does not match the contract")
    return tuple(problems), refusal


class _OpaClient(AsyncOpaClient):  # type: ignore[misc]  # opa-client has no types
    """opa-client, over the managed sidecar's Unix socket when the address is a `unix://` one.

    opa-client opens its session with a TCPConnector and has no parameter for another, so the
    socket needs this override of its (private) session set-up; the session's settings are
    opa-client's own. Other addresses keep opa-client's set-up as it is."""

    def __init__(self, *, address: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._address = address

    async def _init_session(self) -> None:
        # made here, in the event loop that uses it (as opa-client makes its own)
        connector = aiohttp_connector(self._address)
        if connector is None:
            await super()._init_session()
            return
        self._connector = connector
        self._session = aiohttp.ClientSession(
            headers=self.headers,
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )


class DecisionClient:
    """Asks a running OPA server; all answers pass schema validation first."""

    def __init__(
        self,
        url: str,
        timeout_ms: int = 500,
        token: str | None = None,
        local_revision: Callable[[], str | None] | None = None,
        local_name: Callable[[], str | None] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # what identifies the loaded policy when OPA's provenance names no bundle (the managed
        # sidecar's policy directory: its files and restart count); a change re-checks the data
        self._local_revision = local_revision
        # what the audit names that policy by (its files' digest, as /admin/health shows it)
        self._local_name = local_name
        self.data_check: DataCheck | None = None
        self._data_check_lock = asyncio.Lock()
        self.timeout = timeout_ms / 1000.0
        self._token = token
        # the revision key the decision log's mask was last asked for (bundle_status.LogMaskGuard)
        self._mask_key: str | None = None
        self._mask_asked = False
        self._mask_lock = asyncio.Lock()
        parts = urlsplit(http_base(self.url))
        self._opa = _OpaClient(
            address=self.url,  # a unix:// address is the managed sidecar's socket
            host=parts.hostname or "127.0.0.1",
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl=parts.scheme == "https",
            timeout=self.timeout,
            retries=0,  # fail fast: a retry would only turn a deny into a slow deny
            token=token,  # an external OPA's API token
        )
        self._session_lock = asyncio.Lock()
        self._open = False
        # set while OPA is found unfit to trust (an external OPA open to anyone: policy/opa_guard.py);
        # every query then fails closed with this reason
        self.refusal: str | None = None
        schema = _load_schema("decision.schema.json")
        # Every answer is checked by code compiled from the schema (fastjsonschema: ~30 µs where
        # jsonschema takes ~400 µs, on the hot path). jsonschema only words the reason of a refusal;
        # tests/unit/test_decision_schema.py holds the two to the same verdicts.
        self._decision_check = fastjsonschema.compile(schema, use_default=False)
        self._decision_validator = jsonschema.Draft202012Validator(schema)
        self._approver_validator = jsonschema.Draft202012Validator(_load_schema("approver_decision.schema.json"))

    async def close(self) -> None:
        if self._open:
            await self._opa.close_connection()
            self._open = False

    async def _ensure_open(self) -> None:
        # aiohttp sessions belong to the event loop that creates them: open on first use
        if not self._open:
            async with self._session_lock:
                if not self._open:
                    await self._opa.__aenter__()
                    self._open = True

    async def query(self, path: str, input_doc: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """POST one query; returns (result, envelope). Raises PolicyError on any doubt.

        `Encoded` values at the input's top level (a listing's catalog) are sent as they are."""
        if self.refusal is not None:
            raise PolicyError(self.refusal)
        guard = log_mask_guard(self.url)
        if guard is not None:  # OPA logs decisions: never an input while its mask may not remove the arguments
            if guard.stale(self.url):  # an activation since the mask was last asked: ask first, without input
                await self._ask_log_mask(guard)
            if guard.refusal is not None:
                raise PolicyError(guard.refusal)
        package, _, rule = path.rpartition("/")
        try:
            await self._ensure_open()
            if holds_encoded(input_doc):
                envelope = await self._query_encoded(path, splice({"input": splice(input_doc)}).json)
            else:
                envelope = await self._opa.query_rule(
                    input_doc, package.replace("/", "."), rule, query_params=_QUERY_PARAMS
                )
        except TimeoutError as exc:
            raise PolicyError(f"OPA did not answer within {self.timeout * 1000:.0f} ms") from exc
        except aiohttp.ContentTypeError as exc:  # a subclass of ClientResponseError: first
            raise PolicyError("OPA answer is not JSON") from exc
        except aiohttp.ClientResponseError as exc:
            raise PolicyError(f"OPA answered HTTP {exc.status}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise PolicyError(f"OPA unreachable: {type(exc).__name__}") from exc
        except ValueError as exc:
            raise PolicyError("OPA answer is not JSON") from exc
        if not isinstance(envelope, dict) or "result" not in envelope:
            raise PolicyError(f"policy result undefined for data.{path.replace('/', '.')}")
        return envelope["result"], envelope

    @property
    def log_mask_refusal(self) -> str | None:
        """Set while OPA logs decisions and the active bundle's mask does not remove the tool arguments:
        every query is refused unsent (readiness shows it)."""
        guard = log_mask_guard(self.url)
        return None if guard is None else guard.refusal

    async def _ask_log_mask(self, guard: LogMaskGuard, revision: tuple[str | None] | None = None) -> None:
        """Ask OPA's `data.system.log.mask` (a GET: no input, so nothing of a call is logged) and record it
        in `guard`: when an activation is not asked yet, or (`revision`: a revision key in a 1-tuple) for a
        revision this client has not asked it for. Once per activation or revision however many calls wait
        here: each rechecks under the lock. Raises PolicyError when OPA gives no usable answer (the call
        fails closed, unsent; nothing is recorded, so the next call asks again)."""
        async with self._mask_lock:
            if revision is None and not guard.stale(self.url):
                return  # asked meanwhile (another call, the status poll)
            if revision is not None and self._mask_asked and self._mask_key == revision[0]:
                return  # another call asked it for this revision meanwhile
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
            try:
                async with httpx_async_client(self.url, timeout=self.timeout) as client:
                    await guard.ask(self.url, client, headers)
            except (httpx.HTTPError, ValueError, OSError) as exc:
                raise PolicyError(f"cannot read data.system.log.mask from OPA: {type(exc).__name__}") from exc
            if revision is not None:
                self._mask_key, self._mask_asked = revision[0], True

    async def _query_encoded(self, path: str, body: bytes) -> Any:
        """query_rule with the body already encoded (the client's only way is to encode a dict itself):
        the same request on the same session, so the same failures reach query's handlers."""
        url = f"{self._opa.root_url}/data/{path}?{urlencode(_QUERY_PARAMS)}"
        headers = {"Content-Type": "application/json"}
        async with self._opa._request("POST", url, data=body, headers=headers) as response:
            response.raise_for_status()
            return await response.json()

    @staticmethod
    def _provenance(envelope: dict[str, Any]) -> str | None:
        """The bundles' revisions (`name@revision`, joined); a bundle without a revision (built
        without one: its manifest's is "") is not named: its revision is unknown, not `name@`."""
        bundles = (envelope.get("provenance") or {}).get("bundles") or {}
        revs = [
            f"{name}@{rev}"
            for name, b in sorted(bundles.items())
            if isinstance(b, dict) and isinstance(rev := b.get("revision"), str) and rev
        ]
        return ",".join(revs) or None

    def revision_key(self, provenance: str | None) -> str | None:
        """What the data check is kept for: the revision (or the local policy's), and the count of
        bundle activations seen (note_activation), so a revision reused by a new bundle is checked."""
        key = provenance
        if key is None and self._local_revision is not None:
            key = self._local_revision()
        activations = activations_seen(self.url)
        return key if not activations else f"{key or '-'}#activation-{activations}"

    async def decide(self, input_doc: dict[str, Any]) -> Decision:
        try:
            result, envelope = await self.query(DECISION_PATH, input_doc)
        except PolicyError as exc:
            return Decision.fail_closed(str(exc))
        problem = self.contract_problem(result)
        if problem is not None:
            return Decision.fail_closed(problem)
        revision = self._provenance(envelope)
        try:
            check = await self.checked_data(revision)
        except PolicyError as exc:
            return Decision.fail_closed(str(exc))
        if not check.valid:
            assert check.refusal is not None
            return check.refusal
        decision = Decision.from_result(result, envelope, revision)
        if revision is None and self._local_name is not None:
            decision = replace(decision, policy_revision=self._local_name())
        return decision

    async def checked_data(self, revision: str | None) -> DataCheck:
        """The data check of the policy revision an answer came from (its provenance): the data behind
        every answer the gateway acts on must have passed it, once per revision, so a new bundle with
        broken data is caught at its first answer, not at the next probe. Asked for calls, approver
        votes, tools/list and the console's sections alike: while the data is invalid none is decided.

        Raises PolicyError (`policy data check unavailable: ...`) when OPA gives no usable check."""
        check = self.data_check
        key = self.revision_key(revision)
        guard = log_mask_guard(self.url)
        if guard is not None and (not self._mask_asked or self._mask_key != key):
            # a revision this client has not seen: OPA may have activated a bundle the status poll has
            # not reported yet. This answer is logged already; the next query is refused if need be.
            await self._ask_log_mask(guard, (key,))
            if guard.refusal is not None:
                raise PolicyError(guard.refusal)
        if check is None or check.revision != key:
            try:
                check = await self.check_data(key)
            except PolicyError as exc:
                raise PolicyError(f"policy data check unavailable: {exc}") from exc
        return check

    async def _data_valid(self, envelope: dict[str, Any]) -> bool:
        """For the answers that have no refusal to give (tools/list, the console's sections): is the
        data behind this answer valid? False also when the check is unavailable (show nothing)."""
        try:
            return (await self.checked_data(self._provenance(envelope))).valid
        except PolicyError:
            return False

    async def check_data(self, key: str | None = None, force: bool = False) -> DataCheck:
        """Ask OPA whether the policy data is valid; kept until the revision changes (or `force`).

        Raises PolicyError when OPA gives no usable answer (the caller fails closed)."""
        async with self._data_check_lock:
            current = self.data_check
            if not force and current is not None and current.revision == key:
                return current  # another call checked this revision meanwhile
            try:
                result, envelope = await self.query(DATA_CHECK_PATH, {})
            except PolicyError as exc:
                if "undefined" not in str(exc):
                    raise
                # a policy from before the check moved out of the decision: it checks its data in
                # every decision itself (data.invalid), so there is nothing to ask apart
                if current is None or current.revision != key:
                    log.warning("the policy has no data.pvegate.data_check; its decisions check the data")
                check = DataCheck(key, True, checked_at=time.monotonic())
                self.data_check = check
                return check
            check = self._read_data_check(result, envelope, key)
            if not check.valid and (current is None or current.valid or current.problems != check.problems):
                log.error(
                    "policy data invalid (every call is refused until it is fixed): %s", "; ".join(check.problems)
                )
            elif check.valid and current is not None and not current.valid:
                log.warning("policy data valid again")
            self.data_check = check
            return check

    def _read_data_check(self, result: Any, envelope: dict[str, Any], key: str | None) -> DataCheck:
        problems, refusal = read_data_check(result, self.contract_problem)
        if refusal is None:
            return DataCheck(key, True, checked_at=time.monotonic())
        decision = Decision.from_result(refusal, envelope, self._provenance(envelope))
        return DataCheck(key, False, problems, decision, time.monotonic())

    def contract_problem(self, result: Any) -> str | None:
        """Why a decision document breaks the contract (decision.schema.json), or None."""
        try:
            self._decision_check(result)
            return None
        except fastjsonschema.JsonSchemaException:
            pass
        errors = sorted(self._decision_validator.iter_errors(result), key=lambda e: list(e.path))
        if not errors:  # the two validators disagree: refuse all the same
            return "decision does not match the contract"
        where = "/".join(str(p) for p in errors[0].path) or "(root)"
        return f"decision does not match the contract at {where}: {errors[0].message}"

    async def visible_tools(self, input_doc: dict[str, Any]) -> frozenset[str] | None:
        """Names the principal may see, or None when OPA gave no usable answer or the policy data is
        invalid (show nothing)."""
        try:
            result, envelope = await self.query(VISIBLE_TOOLS_PATH, input_doc)
        except PolicyError:
            return None
        if not isinstance(result, list) or not all(isinstance(n, str) for n in result):
            return None
        if not await self._data_valid(envelope):
            return None
        return frozenset(result)

    async def console_sections(self, input_doc: dict[str, Any]) -> frozenset[str] | Unanswered:
        """The admin console's sections the principal may open, or why the policy gave no usable
        answer (OPA unavailable, an answer off the contract, invalid policy data: the data says who
        may open what), in words a signed-in person may read: OPA's own text stays in /admin/health."""
        try:
            result, envelope = await self.query(CONSOLE_PATH, input_doc)
        except PolicyError as exc:
            # the mask's refusal is the gateway's own words: said as it is
            return Unanswered(
                UNMASKED_REFUSAL if str(exc) == UNMASKED_REFUSAL else "the policy decision is unavailable"
            )
        if not isinstance(result, list) or not all(isinstance(n, str) for n in result):
            return Unanswered("the policy's answer does not match the contract")
        try:
            check = await self.checked_data(self._provenance(envelope))
        except PolicyError as exc:
            return Unanswered(
                UNMASKED_REFUSAL if str(exc) == UNMASKED_REFUSAL else "the policy data could not be checked"
            )
        if not check.valid:
            return Unanswered("the policy data is invalid (`pvegate policy check` and /admin/health say where)")
        return frozenset(result)

    async def may_approve(self, input_doc: dict[str, Any]) -> ApproverVerdict:
        """May an approver act on a pending request, and through which of its groups.

        Not while the policy data is invalid: the vote is refused with the words and codes
        (`data.invalid`) every call gets then, as a vote decided on broken data would mint a token
        the agent could redeem once the data is fixed."""
        try:
            result, envelope = await self.query(APPROVER_PATH, input_doc)
            check = await self.checked_data(self._provenance(envelope))
        except PolicyError as exc:
            return ApproverVerdict(
                False, [f"denied: policy decision unavailable ({exc})"], None, [], (FAIL_CLOSED_CODE,)
            )
        if not check.valid:
            assert check.refusal is not None
            refusal = check.refusal
            return ApproverVerdict(False, list(refusal.deny), None, [], tuple(refusal.deny_codes))
        if list(self._approver_validator.iter_errors(result)):
            return ApproverVerdict(
                False, ["denied: approver decision does not match the contract"], None, [], (FAIL_CLOSED_CODE,)
            )
        allowed = bool(result["allow"]) and not result["deny"]
        codes = tuple(sorted({r["code"] for r in result.get("deny_reasons", [])}))
        step_up = result.get("step_up_max_age_seconds")
        return ApproverVerdict(
            allowed,
            list(result["deny"]),
            envelope.get("decision_id"),
            list(result.get("groups", [])),
            codes,
            step_up if isinstance(step_up, int) else None,
        )
