"""Replay recorded decisions against a candidate policy: which of them would it change?

Every decision record keeps the complete policy input it was made on (`input_z`, see
store/audit.py), so a candidate (a policy directory plus data, or a bundle) can be asked
about the same inputs in a second, real OPA. The baseline is what the audit recorded; a
change is an outcome that moves between allow, approval and deny, a risk level that
moves, obligations that differ, or, where both sides need an approval, its terms that
move (how many approvers, which groups, how long it lasts).

Two ways to ask OPA, chosen by measurement (docs/performance.md): `server`, a real
`opa run --server` on loopback asked in batches through `POST /v1/query` (one compiled
policy, several batches in flight), and `eval`, one `opa eval` process per batch.

Before anything is replayed from an audit database its chain is verified (`verify`, as
`pvegate audit verify` does) and the records are read in one snapshot tied to the verified
head; an export file cannot be verified and the report says so. The candidate is code under
review: it is compiled against OPA's capabilities without the builtins that reach the network
(`http.send`, `net.lookup_ip_addr`), so it cannot carry the recorded inputs anywhere.

Only tools/call decisions are replayed: the audit keeps no policy input for approver votes, tool
listings or the console's sections, and every report says so (Report.scope). Given the baseline
policy, those questions are built from the replayed decisions' inputs and asked of both the
baseline and the candidate (compare_unreplayed); an answer that differs is a change of its own kind
(UNREPLAYED_KINDS, in `any`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import math
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.policy.bundles import BundleError, verification_key_problem, verify_signature, wasm_modules
from gateway.policy.decisions import FAIL_CLOSED_CODE, Decision, DecisionClient, PolicyError, read_data_check
from gateway.policy.opa_address import httpx_async_client
from gateway.policy.opa_sidecar import OPASidecar, OPAUnavailable, find_opa
from gateway.store.audit import _TS_RANGE, INPUT_FIELD, ChainChecker, Query, VerifyResult, connect, filter_matches
from gateway.store.pgsync import PgLocation

# outcome transitions, plus the kinds that leave the outcome alone
OUTCOMES = ("allow", "approval", "deny")
TRANSITIONS = tuple(f"{a}-to-{b}" for a in OUTCOMES for b in OUTCOMES if a != b)
# the terms of an approval both sides need (approval.required, and no deny), in pairs: the first of
# each pair weakens it (fewer approvers, a group that could not approve now can, a longer life)
APPROVAL_KINDS = (
    "approvers-fewer",
    "approvers-more",
    "approver-groups-added",
    "approver-groups-removed",
    "approval-ttl-longer",
    "approval-ttl-shorter",
)
# what replay cannot replay (the audit keeps no policy input for them), compared instead between the
# candidate and a baseline policy on inputs built from the replayed decisions (UNREPLAYED): a change
# of who may vote on a recorded pending request, of the tools a recorded principal is listed, of the
# console sections it may open
UNREPLAYED_KINDS = ("approver-changed", "listing-changed", "console-changed")
KINDS = (*TRANSITIONS, "risk", "obligations", *APPROVAL_KINDS, *UNREPLAYED_KINDS)
# names `--fail-on` accepts besides the kinds themselves
ALIASES: dict[str, tuple[str, ...]] = {
    "any": KINDS,
    "approval-required": ("allow-to-approval", "deny-to-approval"),
    "approval-waived": ("approval-to-allow", "approval-to-deny"),
    "approval-weakened": APPROVAL_KINDS[0::2],
    "approval-changed": APPROVAL_KINDS,
    "unreplayed-changed": UNREPLAYED_KINDS,
}
# all candidate decisions of one batch in one query: keyed by position, so an undefined one shows as missing
# the data check once per batch (it depends on data only); its refusal stands for every decision
# while the candidate's data is invalid, as the gateway answers then ([]: a policy from before the
# check moved out of the decision, which checks its data itself)
BATCH_QUERY = (
    "c := [v | v := data.pvegate.data_check]; "
    "x := {i: d | some i, doc in input; d := data.pvegate.decision with input as doc}"
)
_RECORDED = {"allow": "allow", "pending": "approval", "deny": "deny"}
# a recorded input is ~1 KB of JSON (docs/audit.md); one that inflates past this is garbled, not read
MAX_INPUT_BYTES = 1 << 20
# the builtins that reach the network: a candidate under review is compiled without them
NETWORK_BUILTINS = frozenset({"http.send", "net.lookup_ip_addr"})


class ReplayError(Exception):
    """The replay could not run (no candidate, OPA refused it, unreadable source)."""


def expand_kinds(names: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for n in names:
        n = n.strip()
        if not n:
            continue
        if n in ALIASES:
            out |= set(ALIASES[n])
        elif n in KINDS:
            out.add(n)
        else:
            raise ReplayError(f"unknown change kind {n!r}; known: {', '.join((*KINDS, *ALIASES))}")
    return out


@dataclass(frozen=True)
class Recorded:
    """One recorded decision with the input it was made on."""

    seq: int
    ts: float
    request_id: str
    principal: str
    tool: str
    target: str | None
    outcome: str  # allow | approval | deny
    risk: str | None
    obligations: dict[str, Any]
    input: dict[str, Any]
    redacted: tuple[str, ...] = ()
    approval: dict[str, Any] = field(default_factory=dict)  # the decision's approval block, as recorded
    risk_block: dict[str, Any] = field(default_factory=dict)  # the decision's risk block, as recorded


@dataclass
class Skipped:
    no_input: int = 0  # written before inputs were kept
    garbled: int = 0  # a body or kept input that cannot be read (or inflates past MAX_INPUT_BYTES)
    unknown_outcome: int = 0  # an outcome other than allow, pending, deny
    failed_closed: int = 0  # OPA gave no answer then: nothing to compare with


@dataclass(frozen=True)
class Filters:
    since: float | None = None
    until: float | None = None
    tool: str | None = None
    principal: str | None = None
    outcome: str | None = None  # as recorded: allow | pending | deny

    def query(self) -> Query:
        return Query(
            kind="decision",
            tool=self.tool,
            principal=self.principal,
            outcome=self.outcome,
            since=self.since,
            until=self.until,
        )

    def admits(self, row: dict[str, Any]) -> bool:
        """The same filters for rows read from an export file (globs as in `audit search`)."""
        if row.get("kind") != "decision":
            return False
        if self.since is not None and row["ts"] < self.since:
            return False
        if self.until is not None and row["ts"] >= self.until:
            return False
        for col in ("tool", "principal", "outcome"):
            want, have = getattr(self, col), str(row.get(col) or "")
            if want is None:
                continue
            if not filter_matches(have, want):
                return False
        return True


def _unpack(packed: str) -> dict[str, Any] | None:
    """The kept input (canonical JSON, zlib, base64), or None when garbled or larger than MAX_INPUT_BYTES."""
    try:
        z = zlib.decompressobj()
        text = z.decompress(base64.b64decode(packed, validate=True), MAX_INPUT_BYTES + 1)
        if len(text) > MAX_INPUT_BYTES or not z.eof:
            return None
        # NaN, Infinity or a number past a double (1e400) is no JSON value OPA takes: no input it was asked on
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, binascii.Error, zlib.error, RecursionError):  # RecursionError: nested too deeply
        return None
    return doc if isinstance(doc, dict) else None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _recorded(row: dict[str, Any], skipped: Skipped) -> Recorded | None:
    body = row.get("body")
    if not isinstance(body, dict):
        try:
            body = json.loads(body) if isinstance(body, str | bytes) else None
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to be read
            body = None
        if not isinstance(body, dict):
            skipped.garbled += 1
            return None
    if body.get("failed_closed"):
        skipped.failed_closed += 1
        return None
    packed = body.get(INPUT_FIELD)
    if packed is None:
        skipped.no_input += 1
        return None
    doc = _unpack(packed) if isinstance(packed, str) else None
    if doc is None:
        skipped.garbled += 1
        return None
    if row.get("outcome") not in _RECORDED:
        skipped.unknown_outcome += 1
        return None
    rec = _columns(row, body, doc)
    if rec is None:  # an export line without the record's columns, or with ones of the wrong type
        skipped.garbled += 1
    return rec


def _is_int(v: Any) -> bool:
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and v.isdecimal())


def _columns(row: dict[str, Any], body: dict[str, Any], doc: dict[str, Any]) -> Recorded | None:
    """The record from a row whose columns have the audit's types, or None (garbled)."""
    seq, ts, target = row.get("seq"), row.get("ts"), row.get("target")
    request_id, principal, tool = row.get("request_id"), row.get("principal"), row.get("tool")
    risk = body.get("risk") or {}
    obligations = body.get("obligations") or {}
    approval = body.get("approval") or {}
    redacted = body.get("input_redacted") or []
    if not (
        _is_int(seq)
        and isinstance(ts, int | float)
        and not isinstance(ts, bool)
        and math.isfinite(ts)  # an export's inf, NaN or 1e300 is no time (the audit's own range)
        and _TS_RANGE[0] < ts < _TS_RANGE[1]
        and isinstance(request_id, str)
        and all(v is None or isinstance(v, str) for v in (principal, tool, target))  # NULL-able columns
        and isinstance(risk, dict)
        and isinstance(obligations, dict)
        and isinstance(approval, dict)
        and isinstance(redacted, list)
    ):
        return None
    return Recorded(
        seq=int(seq),  # type: ignore[arg-type]  # _is_int: an int or decimal digits
        ts=float(ts),
        request_id=request_id,
        principal=str(principal),
        tool=str(tool),
        target=target,
        outcome=_RECORDED[row["outcome"]],
        risk=risk.get("level"),
        obligations=obligations,
        input=doc,
        redacted=tuple(str(r) for r in redacted),
        approval=approval,
        risk_block=risk,
    )


def read_audit(
    db: Path | PgLocation, filters: Filters, skipped: Skipped, verified: VerifyResult | None = None
) -> Iterator[Recorded]:
    """Decision records from the audit, in one read snapshot. With `verified` (a passing `verify`
    of this database) only records up to its head are read, and only once the snapshot is shown
    to hold the very chain it verified (a record changed since is an error, not a replay)."""
    if verified is not None and not verified.ok:
        raise ReplayError(f"the audit does not verify: {verified.problem}")
    con = connect(db, readonly=True)
    try:
        con.execute("BEGIN")  # the chain walk and the decisions below read the same snapshot
        last: int | None = None
        if verified is not None:
            if verified.first_seq is None or verified.last_seq is None:
                return  # no record in the database when it was verified: nothing to replay
            _same_chain(con, verified)
            last = verified.last_seq
        sql, args = filters.query().sql(isinstance(db, PgLocation))
        for r in con.execute(sql, args):
            row = dict(r)
            if last is not None and int(row["seq"]) > last:
                break  # written after the verification: not replayed
            rec = _recorded(row, skipped)
            if rec is not None:
                yield rec
    finally:
        con.close()


def _same_chain(con: Any, verified: VerifyResult) -> None:
    """In this snapshot, the records from the first to the verified head link up and end in the
    verified head hash: then they are the records `verify` checked (it read its own snapshot)."""
    checker: ChainChecker | None = None
    for r in con.execute("SELECT * FROM audit ORDER BY seq"):
        row = dict(r)
        seq = int(row["seq"])
        if checker is None:
            if seq != verified.first_seq:
                break
            checker = ChainChecker(seq - 1, str(row["prev_hash"]))
        if not checker.feed(row):
            raise ReplayError(f"the audit changed after it was verified: {checker.problem}")
        if seq >= (verified.last_seq or 0):
            break
    if checker is None or checker.end != (verified.last_seq, verified.head_hash):
        raise ReplayError(
            "the audit changed after it was verified: its records no longer lead to the verified head "
            f"(record {verified.last_seq}); run `pvegate audit verify`"
        )


def read_export(path: Path, filters: Filters, skipped: Skipped) -> Iterator[Recorded]:
    """Decision records from a `pvegate audit export --jsonl` file (body as an object). A line
    that is not UTF-8 JSON is an error naming it; a decision line without the record's columns
    (or with ones of the wrong type: a `ts` that is a string, missing, or no number) is counted as
    garbled, before the filters, which cannot place it in time."""
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ReplayError(
                    f"{path}:{n}: not UTF-8 text (is it a `pvegate audit export --jsonl` file?)"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                raise ReplayError(f"{path}:{n}: not a JSON line") from None
            if not isinstance(row, dict) or row.get("kind") != "decision":
                continue
            ts = row.get("ts")
            if not isinstance(ts, int | float) or isinstance(ts, bool):  # no time: garbled, not dropped
                skipped.garbled += 1
                continue
            if filters.admits(row):
                rec = _recorded(row, skipped)
                if rec is not None:
                    yield rec


# --- the candidate ---------------------------------------------------------------------------------

_POLICY_SUFFIXES = (".rego", ".json", ".yaml", ".yml")


def _loaded_as_policy(rel: Path) -> bool:
    """A candidate file replay keeps: Rego or data, not a test, a golden case or a dotfile."""
    if rel.suffix not in _POLICY_SUFFIXES or rel.name.endswith("_test.rego"):
        return False
    return not any(part == "golden" or part.startswith(".") for part in rel.parts)


@dataclass
class Candidate:
    """The policy to try: directories/files (policies plus data) or a bundle."""

    policies: tuple[Path, ...] = ()
    bundle: Path | None = None
    verification_key: Path | None = None

    def __post_init__(self) -> None:
        if self.verification_key is not None and self.bundle is None:  # else the key would be ignored
            raise ReplayError("a verification key needs a bundle: a policy directory carries no signature")
        if self.bundle is not None and self.policies:  # else the files would be ignored: OPA runs the bundle alone
            raise ReplayError(
                "a candidate is a bundle or policy files, not both: --bundle takes no --policies or --data "
                f"(given: {', '.join(map(str, self.policies))}); build them into the bundle"
            )

    @contextlib.contextmanager
    def staged(self) -> Iterator[Candidate]:
        """The candidate as replay checks and runs it: a policy directory's Rego and data files only
        (.rego, .json, .yaml, .yml; tests, golden cases and dotfiles left out), copied into a private
        directory. OPA loads more than `opa check` sees - a `.tar.gz` in a directory is loaded as a
        bundle whose Rego is never checked against the offline capabilities - so what runs must be
        exactly what was checked. A bundle is checked and run as it is (its Wasm refused).

        A path that is not there, one that stages no file, and a candidate without any Rego are
        refused (ReplayError): OPA would run what is left, and an empty policy answers nothing."""
        if self.bundle is not None:
            if not self.bundle.exists():
                raise ReplayError(f"the candidate bundle {self.bundle} does not exist")
            if self.verification_key is not None:  # said before OPA is asked (it would misread the file)
                problem = verification_key_problem(self.verification_key)
                if problem is not None:
                    raise ReplayError(problem)
            yield self
            return
        if not self.policies:
            raise ReplayError("no candidate: give --policies (and --data) or --bundle")
        for given in self.policies:
            if not given.exists():
                raise ReplayError(f"the candidate path {given} does not exist")
        root = Path(tempfile.mkdtemp(prefix="pvegate-replay-candidate-"))
        try:
            staged: list[Path] = []
            rego = 0
            for i, given in enumerate(self.policies):
                into = root / str(i)
                into.mkdir()
                files = [given] if given.is_file() else sorted(p for p in given.rglob("*") if p.is_file())
                kept = 0
                for f in files:
                    rel = Path(f.name) if given.is_file() else f.relative_to(given)
                    if not _loaded_as_policy(rel):
                        continue
                    (into / rel).parent.mkdir(parents=True, exist_ok=True)
                    (into / rel).write_bytes(f.read_bytes())
                    kept += 1
                    rego += rel.suffix == ".rego"
                if not kept:
                    raise ReplayError(_nothing_staged(given))
                staged.append(into / given.name if given.is_file() else into)
            if not rego:
                raise ReplayError(
                    "the candidate has no Rego policy (.rego files other than tests) in "
                    + ", ".join(map(str, self.policies))
                )
            yield Candidate(policies=tuple(staged))
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def describe(self) -> str:
        if self.bundle is not None:
            return f"bundle {self.bundle}" + (" (signature verified)" if self.verification_key else "")
        return "policies " + ", ".join(str(p) for p in self.policies)

    def sidecar(self) -> OPASidecar:
        if self.bundle is None and not self.policies:
            raise ReplayError("no candidate: give --policies (and --data) or --bundle")
        return OPASidecar(policies=self.policies, bundle=self.bundle, verification_key=self.verification_key)

    def eval_args(self) -> list[str]:
        if self.bundle is not None:
            if self.verification_key is not None:  # `opa eval` has no --verification-key: verify first
                raise ReplayError("a signed candidate is evaluated from its verified copy (Candidate.verified)")
            return ["--bundle", str(self.bundle)]
        args = ["--ignore", "*_test.rego", "--ignore", "golden", "--ignore", ".*"]
        for p in self.policies:
            args += ["--data", str(p)]
        return args

    def verified(self, into: Path) -> Candidate:
        """The bundle with its signature verified against the verification key, as `pvegate bundle
        verify` does it (`opa build --verification-key` into `into`, a private directory): a
        candidate `opa eval` can run, since `opa eval` verifies nothing. Itself without a key."""
        if self.bundle is None or self.verification_key is None:
            return self
        copy = into / "verified.tar.gz"
        try:
            verify_signature(self.bundle, self.verification_key, copy)
        except BundleError as exc:
            raise ReplayError(f"the candidate bundle does not verify: {exc}") from None
        return Candidate(bundle=copy)

    def refuse_wasm(self) -> None:
        """A bundle carrying Wasm modules is refused: OPA would run them, not the Rego `opa check` sees."""
        if self.bundle is None:
            return
        try:
            wasm = wasm_modules(self.bundle)
        except (OSError, tarfile.TarError) as exc:
            raise ReplayError(f"cannot read the candidate bundle {self.bundle}: {exc}") from None
        if wasm:  # what a compiled module calls is unseen
            raise ReplayError(
                f"the candidate bundle carries Wasm modules ({', '.join(wasm[:5])}): a replay cannot check "
                "what a compiled module calls, so it does not run one; replay the Rego it was built from"
            )

    def check_offline(self, capabilities: Path) -> None:
        """Compile the candidate (the files OPA will load) against `capabilities`: one that calls a
        network builtin is refused here, before any recorded input is given to it."""
        if self.bundle is not None:
            self.refuse_wasm()
            paths = ["--bundle", str(self.bundle)]
        else:
            paths = ["--ignore", "*_test.rego", "--ignore", "golden", "--ignore", ".*", *map(str, self.policies)]
        cmd = [str(find_opa()), "check", "--capabilities", str(capabilities), *paths]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            problem = (done.stderr or done.stdout).strip()[:800]
            raise ReplayError(
                "the candidate does not compile without network access (a replay runs it without "
                f"{', '.join(sorted(NETWORK_BUILTINS))}): {problem}"
            )


def _nothing_staged(given: Path) -> str:
    if given.is_file():
        hint = " (a bundle? give it with --bundle)" if given.name.endswith((".tar.gz", ".tgz")) else ""
        return f"the candidate file {given} is not a policy or data file (.rego, .json, .yaml, .yml){hint}"
    return f"the candidate directory {given} holds no policy or data file (.rego, .json, .yaml, .yml)"


def start_short_lived(sidecar: OPASidecar) -> None:
    """sidecar.start() for a sidecar the CLI runs for one command: OPA's output goes to a private
    temporary log file (mkstemp: 0600) while it starts, so a refusal carries OPA's own reason (a
    digest mismatch, a compile error) instead of only its exit status; without a log file the
    sidecar discards OPA's output. The file is removed before this returns, whatever happened (an
    OPA that started keeps writing to it unlinked, at --log-level error, until it is stopped)."""
    fd, name = tempfile.mkstemp(prefix="pvegate-opa-start-", suffix=".log")
    os.close(fd)
    log_file = Path(name)
    sidecar.log_file = log_file
    try:
        sidecar.start()
    except OPAUnavailable as exc:  # the log it names is gone: the reason is in the message
        raise OPAUnavailable(str(exc).replace(f" (log: {log_file})", "")) from None
    finally:
        sidecar.log_file = None
        log_file.unlink(missing_ok=True)


class OfflineCapabilities:
    """OPA's current capabilities minus NETWORK_BUILTINS (and no hosts for `allow_net`), in a private
    temporary directory while the engine runs."""

    def __init__(self) -> None:
        self.dir: str | None = None

    def create(self) -> Path:
        done = subprocess.run(
            [str(find_opa()), "capabilities", "--current"], capture_output=True, text=True, timeout=60
        )
        try:
            caps = json.loads(done.stdout) if done.returncode == 0 else None
        except ValueError:
            caps = None
        if not isinstance(caps, dict) or not isinstance(caps.get("builtins"), list):
            raise ReplayError(f"`opa capabilities --current` gave no capabilities: {done.stderr.strip()[:300]}")
        caps["builtins"] = [b for b in caps["builtins"] if b.get("name") not in NETWORK_BUILTINS]
        caps["allow_net"] = []
        self.dir = tempfile.mkdtemp(prefix="pvegate-replay-")  # 0700
        path = Path(self.dir) / "capabilities.json"
        path.write_text(json.dumps(caps))
        return path

    def remove(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


@dataclass(frozen=True)
class Unusable:
    """What stands for each answer of a batch whose data check is unusable: no verdict (undecided),
    as the gateway fails closed on every call then."""

    problem: str


@dataclass(frozen=True)
class Refused:
    """The data check's refusal, standing for each answer of a batch of another entrypoint than the
    decision (an approver vote is refused with it; a listing shows nothing)."""

    refusal: dict[str, Any]


def _batch_results(result: Any, n: int, decisions: bool = True) -> list[Any]:
    """The candidate's answers of one batch, read as the gateway reads them: the data check first
    (read_data_check, the decision client's own reading), whose refusal answers every call while the
    data is invalid; an unusable check (outside the contract, a refusal that allows) makes every
    answer of the batch undecided. No check at all (`c` empty) is a policy from before the check
    moved out of the decision, which checks its data itself."""
    x = result.get("x") if isinstance(result, dict) else None
    if not isinstance(x, dict):
        return [None] * n
    checks = result.get("c")
    if not isinstance(checks, list) or len(checks) > 1:
        return [Unusable("policy data check unavailable: data check does not match the contract")] * n
    if checks:
        try:
            _, refusal = read_data_check(checks[0], contract_problem)
        except PolicyError as exc:
            return [Unusable(f"policy data check unavailable: {exc}")] * n
        if refusal is not None:
            return [refusal if decisions else Refused(refusal)] * n
    return [x.get(str(i)) for i in range(n)]


class ServerEngine:
    """A real `opa run --server` on loopback, asked in batches, several in flight."""

    def __init__(self, candidate: Candidate, batch: int = 100, concurrency: int = 4) -> None:
        if batch < 1 or concurrency < 1:  # a Semaphore(0) would wait forever
            raise ReplayError(f"batch size and concurrency must be at least 1 (given {batch}, {concurrency})")
        self.candidate = candidate
        self.sidecar = candidate.sidecar()
        self.batch = batch
        self.concurrency = concurrency
        self.capabilities = OfflineCapabilities()

    def __enter__(self) -> ServerEngine:
        # `opa run` takes no --capabilities: the files it loads are compiled against them first; a
        # signed bundle's signature is verified before that (a file the signature does not cover is a
        # refused signature, not a compile problem), as the sidecar below verifies it again on start
        try:
            caps = self.capabilities.create()
            self.candidate.refuse_wasm()
            try:
                self.candidate.verified(caps.parent)
            except ReplayError as exc:
                raise ReplayError(f"the candidate OPA did not start: {exc}") from None
            self.candidate.check_offline(caps)
        finally:
            self.capabilities.remove()
        try:
            start_short_lived(self.sidecar)
        except Exception as exc:
            raise ReplayError(f"the candidate OPA did not start: {exc}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        self.sidecar.stop()

    async def _run(self, inputs: list[dict[str, Any]]) -> list[Any]:
        out: list[Any] = [None] * len(inputs)
        sem = asyncio.Semaphore(self.concurrency)
        async with httpx_async_client(self.sidecar.url, timeout=120.0) as client:

            async def one(start: int) -> None:
                chunk = inputs[start : start + self.batch]
                async with sem:
                    r = await client.post("/v1/query", json={"query": BATCH_QUERY, "input": chunk})
                if r.status_code != 200:
                    raise ReplayError(f"the candidate OPA answered HTTP {r.status_code}: {r.text[:300]}")
                try:
                    rows = r.json().get("result") or [{}]
                except ValueError:
                    raise ReplayError(f"the candidate OPA answered no JSON: {r.text[:300]}") from None
                out[start : start + len(chunk)] = _batch_results(rows[0], len(chunk))

            await asyncio.gather(*(one(i) for i in range(0, len(inputs), self.batch)))
        return out

    def evaluate(self, inputs: list[dict[str, Any]]) -> list[Any]:
        return asyncio.run(self._run(inputs))


class EvalEngine:
    """One `opa eval` process per batch (no server; compiles the policy once per batch)."""

    def __init__(self, candidate: Candidate, batch: int = 5000) -> None:
        if batch < 1:
            raise ReplayError(f"batch size must be at least 1 (given {batch})")
        self.candidate = candidate
        self.batch = batch
        if candidate.bundle is None and not candidate.policies:
            raise ReplayError("no candidate: give --policies (and --data) or --bundle")
        self.capabilities = OfflineCapabilities()
        self.caps_file: Path | None = None
        self.run = candidate  # what `opa eval` loads: the candidate, or its verified copy

    def __enter__(self) -> EvalEngine:
        self.caps_file = self.capabilities.create()
        try:
            # a signed bundle: its verified copy (beside the capabilities, private) is what is
            # checked and run; the Wasm check reads the original (the copy holds the same files)
            self.candidate.refuse_wasm()
            self.run = self.candidate.verified(self.caps_file.parent)
            self.run.check_offline(self.caps_file)  # a clear refusal before any input is given
        except BaseException:
            self.capabilities.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.capabilities.remove()

    def evaluate(self, inputs: list[dict[str, Any]], query: str = BATCH_QUERY) -> list[Any]:
        """The answers to `query` (BATCH_QUERY's shape: `c` the data check, `x` the answers by position)."""
        out: list[Any] = []
        for start in range(0, len(inputs), self.batch):
            chunk = inputs[start : start + self.batch]
            with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
                json.dump(chunk, f)
                f.flush()
                if self.caps_file is None:
                    raise ReplayError("the eval engine is used outside its `with` block")
                cmd = [str(find_opa()), "eval", "--format", "json", "--capabilities", str(self.caps_file)]
                cmd += [*self.run.eval_args(), "--input", f.name, query]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise ReplayError(f"opa eval failed: {(done.stderr or done.stdout).strip()[:500]}")
            try:
                doc = json.loads(done.stdout)
            except ValueError:
                raise ReplayError(f"opa eval answered no JSON: {done.stdout.strip()[:300]}") from None
            bindings = ((doc.get("result") or [{}])[0]).get("bindings") or {}
            out += _batch_results(bindings, len(chunk), query == BATCH_QUERY)
        return out


# --- comparing ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    outcome: str  # allow | approval | deny
    risk: str | None
    obligations: dict[str, Any]
    deny_codes: tuple[str, ...] = ()
    problem: str | None = None  # why the candidate's answer stands for a deny (outside the contract)
    approval: dict[str, Any] = field(default_factory=dict)  # the decision's approval block


_contract: list[DecisionClient] = []  # only its schema validators are used; it never connects


def contract_problem(result: Any) -> str | None:
    """DecisionClient.contract_problem: why a decision document breaks the contract, or None."""
    if not _contract:
        _contract.append(DecisionClient("http://127.0.0.1:1"))
    return _contract[0].contract_problem(result)


def verdict(result: Any) -> Verdict:
    """What the gateway would do with the candidate's answer (the same rules as DecisionClient.decide)."""
    if result is None:
        return Verdict("deny", None, {}, ("policy.unavailable",), "policy result undefined")
    if isinstance(result, Unusable):
        return Verdict("deny", None, {}, ("policy.unavailable",), result.problem)
    problem = contract_problem(result)
    if problem is not None:
        return Verdict("deny", None, {}, ("policy.unavailable",), problem)
    d = Decision.from_result(result, {})
    outcome = "allow" if d.allow else "approval" if d.approval_required else "deny"
    return Verdict(outcome, d.risk.get("level"), d.obligations, tuple(d.deny_codes), approval=d.approval)


@dataclass(frozen=True)
class Change:
    rec: Recorded
    after: Verdict
    kinds: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        r = self.rec
        return {
            "seq": r.seq,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.ts)),
            "request_id": r.request_id,
            "principal": r.principal,
            "tool": r.tool,
            "target": r.target,
            "kinds": list(self.kinds),
            "before": {
                "outcome": r.outcome,
                "risk": r.risk,
                "obligations": r.obligations,
                "approval": _approval_view(r.approval),
            },
            "after": {
                "outcome": self.after.outcome,
                "risk": self.after.risk,
                "obligations": self.after.obligations,
                "approval": _approval_view(self.after.approval),
                "deny_codes": list(self.after.deny_codes),
                **({"problem": self.after.problem} if self.after.problem else {}),
            },
            "redacted_input": list(r.redacted),
        }


_APPROVAL_TERMS = ("required", "min_approvals", "approver_groups", "ttl_seconds")


def _approval_view(approval: dict[str, Any]) -> dict[str, Any]:
    """The terms of an approval block a report shows (not its reasons, which follow the rules' wording)."""
    return {k: approval[k] for k in _APPROVAL_TERMS if k in approval}


@dataclass(frozen=True)
class ApprovalTerms:
    """What an approval a decision needs asks for; None for a term the record holds ill-typed."""

    min_approvals: int | None
    groups: frozenset[str] | None
    ttl_seconds: int | None

    @classmethod
    def of(cls, outcome: str, approval: dict[str, Any]) -> ApprovalTerms | None:
        """The terms, or None when the decision needs no approval: none required, or a deny (whatever
        its approval block says, a denied call is not let through by approvers)."""
        if outcome == "deny" or approval.get("required") is not True:
            return None
        n, groups, ttl = approval.get("min_approvals"), approval.get("approver_groups"), approval.get("ttl_seconds")
        return cls(
            n if _is_count(n) else None,
            frozenset(groups) if isinstance(groups, list) and all(isinstance(g, str) for g in groups) else None,
            ttl if _is_count(ttl) else None,
        )


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def approval_kinds(before: ApprovalTerms, after: ApprovalTerms) -> list[str]:
    """How the approval's terms moved between two decisions that both need one (APPROVAL_KINDS)."""
    kinds: list[str] = []
    if before.min_approvals is not None and after.min_approvals is not None:
        if after.min_approvals < before.min_approvals:
            kinds.append("approvers-fewer")
        elif after.min_approvals > before.min_approvals:
            kinds.append("approvers-more")
    if before.groups is not None and after.groups is not None:
        if after.groups - before.groups:  # someone who could not approve now can
            kinds.append("approver-groups-added")
        if before.groups - after.groups:
            kinds.append("approver-groups-removed")
    if before.ttl_seconds is not None and after.ttl_seconds is not None:
        if after.ttl_seconds > before.ttl_seconds:
            kinds.append("approval-ttl-longer")
        elif after.ttl_seconds < before.ttl_seconds:
            kinds.append("approval-ttl-shorter")
    return kinds


def compare(rec: Recorded, after: Verdict) -> Change | None:
    kinds: list[str] = []
    if after.outcome != rec.outcome:
        kinds.append(f"{rec.outcome}-to-{after.outcome}")
    if after.risk != rec.risk:
        kinds.append("risk")
    if after.obligations != rec.obligations:
        kinds.append("obligations")
    before_terms, after_terms = (
        ApprovalTerms.of(rec.outcome, rec.approval),
        ApprovalTerms.of(after.outcome, after.approval),
    )
    if before_terms is not None and after_terms is not None:
        kinds += approval_kinds(before_terms, after_terms)
    return Change(rec, after, tuple(kinds)) if kinds else None


def _approval_delta(example: dict[str, Any]) -> str:
    """For a reported change of an approval's terms, the terms that moved, e.g. ` (approvers 2 -> 1)`."""
    if not set(example["kinds"]) & set(APPROVAL_KINDS):
        return ""
    b, a = example["before"].get("approval") or {}, example["after"].get("approval") or {}
    parts = []
    for key, label in (("min_approvals", "approvers"), ("approver_groups", "groups"), ("ttl_seconds", "ttl")):
        was, now = b.get(key), a.get(key)
        if key == "approver_groups":
            was, now = (",".join(sorted(map(str, v))) or "-" if isinstance(v, list) else v for v in (was, now))
        if was != now:
            parts.append(f"{label} {was} -> {now}")
    return f" ({'; '.join(parts)})" if parts else ""


# --- what is not replayed: approver votes, tool listings, console sections ----------------------------

# (entrypoint, what the report calls its answers, the rule, the change kind)
UNREPLAYED = (
    ("approver", "approver votes", "data.pvegate.approver.decision", "approver-changed"),
    ("visible_tools", "tool listings (tools/list)", "data.pvegate.visible_tools", "listing-changed"),
    ("console", "console sections", "data.pvegate.console.sections", "console-changed"),
)
_UNREPLAYED_RULES = {e: rule for e, _, rule, _ in UNREPLAYED}
_UNREPLAYED_KIND = {e: kind for e, _, _, kind in UNREPLAYED}
# how many principals and pending requests of the replayed decisions the inputs are built from (the
# approver inputs are their product): enough for the distinct roles and groups of an audit
MAX_UNREPLAYED_PRINCIPALS = 200
MAX_UNREPLAYED_PENDING = 50


def _unreplayed_query(entrypoint: str) -> str:
    return (
        "c := [v | v := data.pvegate.data_check]; "
        f"x := {{i: d | some i, doc in input; d := {_UNREPLAYED_RULES[entrypoint]} with input as doc}}"
    )


_approver_schema: list[Any] = []


def _approver_problem(result: Any) -> bool:
    """Whether an approver answer breaks its contract (approver_decision.schema.json), as may_approve reads it."""
    if not _approver_schema:
        from importlib import resources

        import jsonschema

        text = resources.files("gateway.schemas").joinpath("approver_decision.schema.json").read_text()
        _approver_schema.append(jsonschema.Draft202012Validator(json.loads(text)))
    return bool(list(_approver_schema[0].iter_errors(result)))


def unreplayed_answer(entrypoint: str, result: Any) -> dict[str, Any]:
    """What the gateway would act on, from one answer of `entrypoint` (read as DecisionClient.may_approve,
    visible_tools and console_sections read theirs): for a vote whether it is allowed, through which
    groups, with which codes; for a listing or the console's sections the names, or none at all (no
    usable answer, invalid data: the gateway shows nothing)."""
    if entrypoint == "approver":
        if result is None or isinstance(result, Unusable):
            return {"allow": False, "codes": [FAIL_CLOSED_CODE]}
        if isinstance(result, Refused):  # invalid data: the vote is refused with the data check's refusal
            return {"allow": False, "codes": Decision.from_result(result.refusal, {}).deny_codes}
        if _approver_problem(result):
            return {"allow": False, "codes": [FAIL_CLOSED_CODE]}
        step_up = result.get("step_up_max_age_seconds")
        return {
            "allow": bool(result["allow"]) and not result["deny"],
            "codes": sorted({r["code"] for r in result.get("deny_reasons", [])}),
            "groups": sorted(result.get("groups", [])),
            "step_up_max_age_seconds": step_up if isinstance(step_up, int) else None,
        }
    if not isinstance(result, list) or not all(isinstance(n, str) for n in result):
        return {"names": None}  # no usable answer, or a refusal for invalid data: nothing shown
    return {"names": sorted(set(result))}


@dataclass
class UnreplayedInputs:
    """The inputs of the entrypoints replay cannot replay, built from the replayed decisions' inputs:
    for each principal, a tools/list (of the tools the decisions name) and a console listing; for each
    pending decision (an approval needed), a vote on it by each principal (the requester too)."""

    principals: dict[str, tuple[dict[str, Any], dict[str, Any], float]] = field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    pending: dict[str, Recorded] = field(default_factory=dict)

    def add(self, rec: Recorded) -> None:
        doc = rec.input
        principal, request, tool = doc.get("principal"), doc.get("request"), doc.get("tool")
        if isinstance(principal, dict) and isinstance(principal.get("sub"), str):
            key = json.dumps(principal, sort_keys=True)
            if key not in self.principals and len(self.principals) < MAX_UNREPLAYED_PRINCIPALS:
                self.principals[key] = (principal, request if isinstance(request, dict) else {}, rec.ts)
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            self.tools.setdefault(tool["name"], tool)
        if rec.outcome == "approval" and ApprovalTerms.of(rec.outcome, rec.approval) is not None:
            key = json.dumps([rec.principal, rec.tool, doc.get("target"), _approval_view(rec.approval)], sort_keys=True)
            if key not in self.pending and len(self.pending) < MAX_UNREPLAYED_PENDING:
                self.pending[key] = rec

    def build(self) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
        """entrypoint -> [(what a report names the input by, the input)]."""
        tools = [self.tools[n] for n in sorted(self.tools)]
        out: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {e: [] for e, *_ in UNREPLAYED}
        for principal, request, _ in self.principals.values():
            facts = {**request, "method": "tools/list"}
            for entrypoint, listed in (("visible_tools", tools), ("console", [])):
                doc = {"contract_version": 1, "kind": "list", "principal": principal, "request": facts, "tools": listed}
                out[entrypoint].append(({"principal": principal["sub"]}, doc))
        for rec in self.pending.values():
            pending = _pending_input(rec)
            recorded = rec.input.get("request")
            facts = recorded if isinstance(recorded, dict) else {}  # an export's odd line: no facts, no crash
            for principal, request, _ in self.principals.values():
                doc = {
                    "contract_version": 1,
                    "kind": "approve",
                    "approver": principal,
                    # signed in at the recorded call's time: a step-up is not what is compared
                    "authentication": {"auth_time": rec.ts, "via": "bearer"},
                    "pending": pending,
                    "request": {**facts, "method": "approvals/approve",
                                "protocol_version": None, "source_ip": request.get("source_ip")},
                }  # fmt: skip
                name = {"approver": principal["sub"], "request_id": rec.request_id, "tool": rec.tool}
                out["approver"].append((name, doc))
        return out


def _pending_input(rec: Recorded) -> dict[str, Any]:
    """A recorded pending decision as the approver policy sees its request (ApprovalRequest.pending_input)."""
    ttl = rec.approval.get("ttl_seconds")
    life = ttl if isinstance(ttl, int) and not isinstance(ttl, bool) and ttl > 0 else 900
    return {
        "id": f"apr-replay-{rec.seq}",
        "requester": rec.principal,
        "tool": rec.input.get("tool"),
        "arguments_digest": rec.input.get("arguments_digest"),
        "target": rec.input.get("target"),
        "risk": rec.risk_block,
        "approver_groups": rec.approval.get("approver_groups") or [],
        "min_approvals": rec.approval.get("min_approvals"),
        "approvals_so_far": [],
        "expires_at": _rfc3339(rec.ts + life),
    }


def _rfc3339(ts: float) -> str:
    """`ts` as RFC 3339 UTC; a time past what the platform can show (a contract-valid ttl_seconds of
    10**20) is the last second of year 9999: still unexpired, as the request was when recorded."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return "9999-12-31T23:59:59Z"


@dataclass
class Unreplayed:
    """The comparison of the candidate with a baseline on what replay cannot replay."""

    baseline: str | None = None  # the baseline policy (None: none given, nothing compared)
    inputs: dict[str, int] = field(default_factory=dict)  # entrypoint -> inputs compared
    changes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def compared(self) -> bool:
        return self.baseline is not None

    def by_kind(self) -> dict[str, int]:
        c = Counter(ch["kind"] for ch in self.changes)
        return {k: c[k] for k in UNREPLAYED_KINDS if c[k]}


def compare_unreplayed(
    inputs: UnreplayedInputs, candidate: Candidate, baseline: Candidate, unreplayed: Unreplayed
) -> None:
    """Ask the candidate and the baseline (both staged, each in its own `opa eval`, offline) the
    approver, listing and console questions built from the replayed decisions, and keep every input
    whose answers differ in what the gateway would act on (unreplayed_answer)."""
    built = inputs.build()
    with EvalEngine(baseline) as before, EvalEngine(candidate) as after:
        for entrypoint, *_ in UNREPLAYED:
            named = built[entrypoint]
            unreplayed.inputs[entrypoint] = len(named)
            if not named:
                continue
            docs = [doc for _, doc in named]
            query = _unreplayed_query(entrypoint)
            for (name, _), b, a in zip(named, before.evaluate(docs, query), after.evaluate(docs, query), strict=True):
                was, now = unreplayed_answer(entrypoint, b), unreplayed_answer(entrypoint, a)
                if was == now:
                    continue
                change: dict[str, Any] = {"kind": _UNREPLAYED_KIND[entrypoint], "entrypoint": entrypoint, **name}
                change.update(before=was, after=now)
                if entrypoint != "approver" and was["names"] is not None and now["names"] is not None:
                    change["added"] = sorted(set(now["names"]) - set(was["names"]))
                    change["removed"] = sorted(set(was["names"]) - set(now["names"]))
                unreplayed.changes.append(change)


def _unreplayed_line(ch: dict[str, Any]) -> str:
    b, a = ch["before"], ch["after"]
    if ch["entrypoint"] == "approver":

        def vote(v: dict[str, Any]) -> str:
            return ("allowed" if v["allow"] else "refused") + (f" [{', '.join(v['codes'])}]" if v["codes"] else "")

        return f"{ch['approver']} voting on {ch['tool']} ({ch['request_id']}): {vote(b)} -> {vote(a)}"
    what = "tools/list" if ch["entrypoint"] == "visible_tools" else "console sections"
    if "added" in ch:
        moved = [f"+{n}" for n in ch["added"]] + [f"-{n}" for n in ch["removed"]]
        return f"{what} of {ch['principal']}: {' '.join(moved)}"
    return f"{what} of {ch['principal']}: {b['names']} -> {a['names']} (None: nothing shown)"


# --- the report ------------------------------------------------------------------------------------


@dataclass
class Report:
    candidate: str
    source: str
    filters: Filters
    # what was checked of the recorded decisions: "audit verified: ...", "audit NOT verified ...",
    # or "input: an export, not verified"
    integrity: str = "audit NOT verified"
    verified: bool = False
    replayed: int = 0
    skipped: Skipped = field(default_factory=Skipped)
    changes: list[Change] = field(default_factory=list)
    seconds: float = 0.0
    fail_on: tuple[str, ...] = ()
    fail_above: int = 0
    max_examples: int = 3
    # answers that are no policy verdict (undefined, or outside the decision contract): the gateway
    # would fail closed on them, the report counts them as denials, and any one fails the run
    undecided: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    # replayed inputs the audit kept with redacted arguments: the candidate saw `[redacted]` where the
    # gateway's OPA saw the real value, so their verdict, changed or not, is approximate
    redacted: int = 0
    redacted_paths: Counter[str] = field(default_factory=Counter)
    fail_on_redacted: bool = False  # --fail-on-redacted: any such input fails the run
    # approver votes, tool listings and console sections: not replayed (the audit keeps no input for
    # them); compared with a baseline policy when one is given (replay(baseline=...))
    unreplayed: Unreplayed = field(default_factory=Unreplayed)

    @property
    def redacted_changed(self) -> int:
        return sum(1 for ch in self.changes if ch.rec.redacted)

    @property
    def by_kind(self) -> dict[str, int]:
        c = Counter(k for ch in self.changes for k in ch.kinds)
        return {k: c[k] for k in KINDS if c[k]}

    @property
    def failing(self) -> int:
        """Changes of a kind named by --fail-on: of replayed decisions, and of the approver, listing and
        console answers compared with the baseline."""
        want = set(self.fail_on)
        return sum(1 for ch in self.changes if want & set(ch.kinds)) + sum(
            1 for ch in self.unreplayed.changes if ch["kind"] in want
        )

    def scope(self) -> dict[str, Any]:
        """What was replayed and what was not: every report format states it."""
        u = self.unreplayed
        return {
            "replayed": ["tools/call decisions (data.pvegate.decision)"],
            "not_replayed": [f"{label} ({rule})" for _, label, rule, _ in UNREPLAYED],
            "compared_with_baseline": u.compared,
            "baseline": u.baseline,
            "baseline_inputs": dict(u.inputs),
        }

    def scope_lines(self) -> list[str]:
        u = self.unreplayed
        lines = [
            "scope:     replayed: tools/call decisions (data.pvegate.decision); NOT replayed (the audit keeps no "
            "policy input for them): " + ", ".join(f"{label} ({rule})" for _, label, rule, _ in UNREPLAYED)
        ]
        if not u.compared:
            lines.append(
                "unchecked: approver votes, tool listings and console sections were not compared with a baseline "
                "policy (none given): a candidate that changes who may approve, which tools are listed or which "
                "console sections open passes this replay unseen"
            )
            return lines
        counts = ", ".join(f"{n} {e}" for e, n in u.inputs.items())
        lines.append(
            f"baseline:  {u.baseline}: compared on inputs built from the replayed decisions ({counts}); "
            f"{len(u.changes)} answer(s) differ"
            + (" (" + ", ".join(f"{k} {n}" for k, n in u.by_kind().items()) + ")" if u.changes else "")
        )
        if u.changes:
            lines.append(
                f"warning: the candidate answers {len(u.changes)} approver, listing or console question(s) "
                "differently from the baseline (not replayed decisions: questions built from them); "
                "--fail-on any or unreplayed-changed fails the run on them"
            )
        return lines

    @property
    def failed(self) -> bool:
        """Past the --fail-on threshold, or any undecided answer (whatever --fail-on says), or with
        --fail-on-redacted any replayed input with redacted arguments."""
        return (
            self.undecided > 0
            or (bool(self.fail_on) and self.failing > self.fail_above)
            or (self.fail_on_redacted and self.redacted > 0)
        )

    @property
    def rate(self) -> float:
        return self.replayed / self.seconds if self.seconds > 0 else 0.0

    def groups(self) -> list[dict[str, Any]]:
        grouped: dict[tuple[str, str], list[Change]] = defaultdict(list)
        for ch in self.changes:
            grouped[(ch.rec.tool, ch.rec.principal)].append(ch)
        out = []
        for (tool, principal), chs in sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            kinds = Counter(k for ch in chs for k in ch.kinds)
            out.append(
                {
                    "tool": tool,
                    "principal": principal,
                    "count": len(chs),
                    "kinds": {k: kinds[k] for k in KINDS if kinds[k]},
                    "examples": [ch.as_dict() for ch in chs[: self.max_examples]],
                }
            )
        return out

    def as_json(self) -> dict[str, Any]:
        f = self.filters
        return {
            "candidate": self.candidate,
            "source": self.source,
            "integrity": self.integrity,
            "verified": self.verified,
            "filters": {k: v for k, v in vars(f).items() if v is not None},
            "replayed": self.replayed,
            "undecided": self.undecided,
            "undecided_problems": dict(self.problems.most_common()),
            "redacted": self.redacted,
            "redacted_changed": self.redacted_changed,
            "redacted_paths": dict(self.redacted_paths.most_common()),
            "fail_on_redacted": self.fail_on_redacted,
            "skipped": vars(self.skipped),
            "changed": len(self.changes),
            "by_kind": self.by_kind,
            "seconds": round(self.seconds, 3),
            "decisions_per_second": round(self.rate, 1),
            "fail_on": list(self.fail_on),
            "fail_above": self.fail_above,
            "failing": self.failing,
            "failed": self.failed,
            "groups": self.groups(),
            "changes": [ch.as_dict() for ch in self.changes],
            "scope": self.scope(),
            "unreplayed_changes": self.unreplayed.changes,
        }

    def summary(self) -> list[str]:
        s = self.skipped
        lines = [
            f"candidate: {self.candidate}",
            f"source:    {self.source}",
            f"integrity: {self.integrity}",
            f"replayed {self.replayed} decisions in {self.seconds:.2f}s ({self.rate:.0f}/s); "
            f"skipped {s.no_input} without a recorded input, {s.failed_closed} failed closed"
            + (f", {s.unknown_outcome} with an unknown outcome" if s.unknown_outcome else ""),
            f"changed:   {len(self.changes)}"
            + (" (" + ", ".join(f"{k} {n}" for k, n in self.by_kind.items()) + ")" if self.changes else ""),
            *self.scope_lines(),
        ]
        if self.redacted_changed:
            lines.append(f"           {self.redacted_changed} of them on inputs with redacted arguments (approximate)")
        if s.garbled:
            lines.append(
                f"warning: {s.garbled} decision record(s) have a garbled input or body (unreadable, or "
                f"larger than {MAX_INPUT_BYTES} bytes unpacked) or columns (missing, of the wrong type, a `ts` "
                "that is no time) and were not replayed"
            )
        lines.append(f"undecided: {self.undecided} answer(s) undefined or outside the decision contract")
        lines.append(f"redacted:  {self.redacted} replayed input(s) with redacted arguments (not fully replayable)")
        if self.redacted:
            paths = ", ".join(f"{p} ({n})" for p, n in self.redacted_paths.most_common(3))
            lines.append(
                f"warning: {self.redacted} of {self.replayed} replayed decisions rest on inputs with redacted "
                f"arguments ({paths}): the candidate saw `[redacted]` where the recorded decision saw the real "
                f"value, so their verdicts are approximate and the {self.redacted - self.redacted_changed} of them "
                "that compared equal prove little; --fail-on-redacted fails the run on them"
            )
        if self.undecided:
            top = "; ".join(f"{p} ({n})" for p, n in self.problems.most_common(3))
            lines.append(
                f"error:     the candidate gave no verdict on {self.undecided} of {self.replayed} decisions ({top}): "
                "counted as denials, as the gateway would fail closed; this fails the run whatever --fail-on says"
            )
        if self.fail_on or self.undecided or self.fail_on_redacted:
            verdict_ = "FAILED" if self.failed else "passed"
            gate = []
            if self.fail_on:
                gate.append(f"{self.failing} change(s) of {', '.join(self.fail_on)} (allowed: {self.fail_above})")
            if self.undecided:
                gate.append(f"{self.undecided} undecided answer(s) (allowed: 0)")
            if self.fail_on_redacted:
                gate.append(f"{self.redacted} replayed input(s) with redacted arguments (allowed: 0)")
            elif self.redacted:
                gate.append(f"{self.redacted} on redacted inputs, approximate and not gated (--fail-on-redacted)")
            if not self.unreplayed.compared:
                gate.append("approver votes, tool listings and console sections NOT checked (no baseline)")
            lines.append(f"gate:      {verdict_}: {'; '.join(gate)}")
        return lines

    def as_text(self) -> str:
        lines = self.summary()
        for g in self.groups():
            kinds = ", ".join(f"{k} {n}" for k, n in g["kinds"].items())
            lines.append(f"\n{g['tool']}  {g['principal']}  {g['count']} changed ({kinds})")
            for ex in g["examples"]:
                b, a = ex["before"], ex["after"]
                codes = f" [{', '.join(a['deny_codes'])}]" if a["deny_codes"] else ""
                lines.append(
                    f"  {ex['time']} {ex['request_id']} {ex['target'] or '-'}: {b['outcome']}/{b['risk']} -> "
                    f"{a['outcome']}/{a['risk']}{codes}{_approval_delta(ex)}"
                )
        if self.unreplayed.changes:
            lines.append("\nnot replayed, answered differently from the baseline:")
            lines += [f"  {_unreplayed_line(ch)}" for ch in self.unreplayed.changes[: self.max_examples * 10]]
        return "\n".join(lines) + "\n"

    def as_markdown(self) -> str:
        out = ["# Policy replay report", ""]
        out += [f"- {line}" for line in self.summary()]
        if self.unreplayed.changes:
            out += ["", "## Not replayed: answered differently from the baseline", ""]
            out += [f"- {_unreplayed_line(ch)}" for ch in self.unreplayed.changes[: self.max_examples * 10]]
        if not self.changes:
            out += ["", "No recorded decision changes under the candidate."]
            return "\n".join(out) + "\n"
        out += ["", "## Changes by kind", "", "| kind | decisions |", "|---|---:|"]
        out += [f"| {k} | {n} |" for k, n in self.by_kind.items()]
        out += ["", "## By tool and principal", "", "| tool | principal | changed | kinds |", "|---|---|---:|---|"]
        groups = self.groups()
        for g in groups:
            kinds = ", ".join(f"{k} {n}" for k, n in g["kinds"].items())
            out.append(f"| `{g['tool']}` | `{g['principal']}` | {g['count']} | {kinds} |")
        out += ["", "## Examples", ""]
        out += ["| time | request | tool | principal | target | before | after | codes |"]
        out += ["|---|---|---|---|---|---|---|---|"]
        for g in groups:
            for ex in g["examples"]:
                b, a = ex["before"], ex["after"]
                out.append(
                    f"| {ex['time']} | `{ex['request_id']}` | `{ex['tool']}` | `{ex['principal']}` | "
                    f"{ex['target'] or '-'} | {b['outcome']} / {b['risk']} | {a['outcome']} / {a['risk']}"
                    f"{_approval_delta(ex)} | {', '.join(a['deny_codes']) or '-'} |"
                )
        return "\n".join(out) + "\n"


def replay(
    records: Iterable[Recorded],
    engine: ServerEngine | EvalEngine,
    report: Report,
    chunk: int = 20000,
    baseline: Candidate | None = None,
) -> Report:
    """Ask the candidate about every record (in chunks, to bound memory) and collect the changes.

    With a `baseline` (the policy the records were decided by: a policy directory or bundle), the
    approver, listing and console questions built from the replayed decisions are asked of both and
    every answer that differs is reported (compare_unreplayed); without one the report says they were
    not compared."""
    started = time.perf_counter()
    pending: list[Recorded] = []
    questions = UnreplayedInputs()

    def flush() -> None:
        results = engine.evaluate([r.input for r in pending])
        for rec, result in zip(pending, results, strict=True):
            if rec.redacted:
                report.redacted += 1
                report.redacted_paths.update(rec.redacted)
            after = verdict(result)
            if after.problem is not None:
                report.undecided += 1
                report.problems[after.problem[:300]] += 1
            ch = compare(rec, after)
            if ch is not None:
                report.changes.append(ch)
        report.replayed += len(pending)
        pending.clear()

    for rec in records:
        pending.append(rec)
        questions.add(rec)
        if len(pending) >= chunk:
            flush()
    if pending:
        flush()
    if baseline is not None:
        report.unreplayed.baseline = baseline.describe()
        with baseline.staged() as base:
            compare_unreplayed(questions, engine.candidate, base, report.unreplayed)
    report.seconds = time.perf_counter() - started
    if report.replayed and report.undecided == report.replayed:
        # not a policy that denies everything: one that was never asked (no data.pvegate.decision,
        # a misspelt package, answers of another shape); nothing was compared
        top = "; ".join(f"{p} ({n})" for p, n in report.problems.most_common(3))
        raise ReplayError(
            f"the candidate gave no verdict on any of the {report.replayed} decisions ({top}): it cannot be "
            "evaluated; does it define data.pvegate.decision as the contract says (docs/policy-contract.md)?"
        )
    return report
