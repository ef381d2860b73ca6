"""`pvegate policy eval|check|explain`: policy-author tools, each answered by a real OPA.

eval: the decision for an input file, from a temporary managed sidecar on the policy
directory or bundle, or an already running OPA given by --opa-url; with --entrypoint
visible_tools or approver the tool listing or approver vote, each asked through the gateway's
decision client (the contract and the policy data check applied: what the gateway would act on).
Exit 0 with a decision, 1 without a policy answer (OPA did not start or answer, or the decision,
listing or vote failed closed: the gateway would deny with policy.unavailable, list no tool,
refuse the vote), 2 for an unreadable input or a usage error (a
--verification-key that is missing, unreadable, no PEM public key or a private key among them; a
--policies that is no policy directory, as explain and check answer it too).
check: the policy data against its JSON Schema, the policy's own data problems and the tool catalog
the gateway serves (every tool, tool tag and argument the data names must exist), before a bundle
is built (non-zero exit on any problem; 2 when --policies is no policy directory).
explain: the decision for an input and which rules fired (reasons with codes, bindings, roles,
matching deny/approval rules and quotas), optionally with OPA's own --explain trace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gateway.cli.commands.replay import key_needs_bundle, register_replay
from gateway.policy.authoring import AuthoringError, check_data, explain
from gateway.policy.bundles import verification_key_problem
from gateway.policy.catalog_refs import CONNECTORS_ENV, default_connectors
from gateway.policy.decisions import (
    APPROVER_PATH,
    DECISION_PATH,
    FAIL_CLOSED_CODE,
    VISIBLE_TOOLS_PATH,
    DecisionClient,
    PolicyError,
)
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable, client_token
from gateway.store.replay import start_short_lived
from gateway.tools.catalog import Catalog, CatalogError

ENTRYPOINTS = {"decision": DECISION_PATH, "visible_tools": VISIBLE_TOOLS_PATH, "approver": APPROVER_PATH}


async def _ask(url: str, entrypoint: str, doc: dict[str, Any], token: str | None) -> dict[str, Any]:
    """What the gateway would act on, asked as it asks (DecisionClient: the answer checked against the
    contract, and against the policy data check). `failed_closed` true: no usable answer."""
    client = DecisionClient(url, timeout_ms=5000, token=token)
    try:
        if entrypoint == "decision":
            d = await client.decide(doc)
            return d.as_dict()
        if entrypoint == "visible_tools":
            tools = await client.visible_tools(doc)
            if tools is None:  # the gateway lists no tool then
                return {
                    "visible_tools": [],
                    "failed_closed": True,
                    "deny": [
                        "no usable answer: OPA gave none, it is outside the contract, or the policy data is "
                        "invalid or could not be checked (the gateway lists no tool)"
                    ],
                }
            return {"visible_tools": sorted(tools), "failed_closed": False}
        v = await client.may_approve(doc)
        return {
            "allow": v.allowed,
            "deny": v.reasons,
            "deny_codes": list(v.codes),
            "groups": v.groups,
            "step_up_max_age_seconds": v.step_up_max_age,
            "decision_id": v.decision_id,
            # no answer of the policy: the vote is refused (a refusal for invalid data is one, data.invalid)
            "failed_closed": FAIL_CLOSED_CODE in v.codes,
        }
    finally:
        await client.close()


def _read_input(path: Path) -> Any:
    """An input document; golden-case files and OPA request bodies are taken as they are. ValueError when
    it is no JSON object (a policy input always is one), or nested past what can be read."""
    raw = sys.stdin.read() if str(path) == "-" else path.read_text()
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError("it is nested too deeply to be read") from None
    if not isinstance(doc, dict):
        kind = "an array" if isinstance(doc, list) else "null" if doc is None else f"a {type(doc).__name__}"
        raise ValueError(f"it is {kind}, not a JSON object (a policy input is one)")
    if isinstance(doc, dict) and len(doc) == 1 and "contract_version" not in doc:
        (only,) = doc.values()  # a golden case file: {"<name>": {"input": ...}}
        if isinstance(only, dict) and "input" in only:
            doc = only
    if isinstance(doc, dict) and "input" in doc and "contract_version" not in doc:
        doc = doc["input"]
    return doc


def _policy_dir_problem(policies: Path) -> str | None:
    """Why `policies` is no policy directory (None: it is one), as `policy explain` says it: checked
    before OPA is started on it, which would otherwise fail on the missing files half way."""
    if not (policies / "pvegate").is_dir():
        return f"{policies} is not a policy directory (no pvegate/)"
    return None


def _eval(args: argparse.Namespace) -> int:
    try:
        doc = _read_input(args.input)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read input: {exc}", file=sys.stderr)
        return 2
    if args.opa_url is None and args.bundle is None and (problem := _policy_dir_problem(args.policies)) is not None:
        print(f"error: {problem}", file=sys.stderr)  # a usage error, as `policy explain` answers it
        return 2
    if args.verification_key is not None and args.opa_url is None:  # said before OPA is asked
        problem = verification_key_problem(args.verification_key)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    sidecar: OPASidecar | None = None
    try:
        url = args.opa_url
        if url is None:
            sidecar = OPASidecar(policies=(args.policies,), bundle=args.bundle, verification_key=args.verification_key)
            start_short_lived(sidecar)  # OPA's reason for refusing the policy or bundle reaches the error
            url = sidecar.url
        out = asyncio.run(_ask(url, args.entrypoint, doc, client_token(sidecar)))
    except (OPAUnavailable, PolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if sidecar is not None:
            sidecar.stop()
    print(json.dumps(out, indent=2))
    if out.get("failed_closed") is True:  # no policy answer: not a verdict of the policy
        reason = "; ".join(str(d) for d in out.get("deny") or ()) or "no policy answer"
        what = {"decision": "decision", "visible_tools": "tool listing", "approver": "approver decision"}
        print(f"error: the {what[args.entrypoint]} failed closed (no policy answer): {reason}", file=sys.stderr)
        return 1
    return 0


def _load_catalog(connectors: Path) -> Catalog:
    """The tool catalog a gateway with this connector directory serves. AuthoringError when it cannot
    be loaded (the gateway would not start with it either)."""
    if not connectors.is_dir():
        raise AuthoringError(f"no connector directory {connectors}: give the gateway's with --connectors")
    try:
        return Catalog.load(connectors)
    except (CatalogError, OSError, UnicodeDecodeError) as exc:
        raise AuthoringError(f"cannot load the tool catalog from {connectors}: {exc}") from exc


def _check(args: argparse.Namespace) -> int:
    if (problem := _policy_dir_problem(args.policies)) is not None:  # not a report of "problems" in its data
        print(f"error: {problem}", file=sys.stderr)
        return 2
    connectors = args.connectors or default_connectors()
    try:
        report = check_data(args.policies, args.data, connectors, _load_catalog(connectors))
    except (AuthoringError, OPAUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"data": str(report.data_file), "ok": report.ok, "schema_problems": report.schema_problems,
                          "policy_problems": report.policy_problems, "connectors": str(report.connectors),
                          "catalog_problems": report.catalog_problems}, indent=2))  # fmt: skip
        return 0 if report.ok else 1
    print(f"policy data: {report.data_file}")
    for title, problems in (
        ("JSON Schema (policies/pvegate/config/schema/data.json)", report.schema_problems),
        ("policy (data.pvegate.config.problems: every call is denied until fixed)", report.policy_problems),
        (f"tool catalog ({report.connectors}: tools, tool tags and arguments the data names)", report.catalog_problems),
    ):
        print(f"{title}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            print(f"  - {problem}")
    print("OK" if report.ok else "FAILED: fix the data before building a bundle")
    return 0 if report.ok else 1


def _reason_lines(reasons: list[dict[str, str]]) -> list[str]:
    return [f"  - [{r['code']}] {r['message']}\n      rule: {r['rule']}" for r in reasons]


def _explain(args: argparse.Namespace) -> int:
    try:
        doc = _read_input(args.input)
        out = explain(args.policies, doc, args.data, args.opa_explain)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read input: {exc}", file=sys.stderr)
        return 2
    except (AuthoringError, OPAUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    d = out["decision"]
    verdict = "ALLOW" if d["allow"] else "PENDING APPROVAL" if not d["deny"] and d["approval"]["required"] else "DENY"
    lines = [f"decision: {verdict} (risk {d['risk']['level']}, score {d['risk']['score']})"]
    for key, title in (("input_problems", "input problems"), ("data_problems", "policy data problems")):
        if out[key]:
            lines += [f"{title}:"] + [f"  - {p}" for p in out[key]]
    lines += ["deny reasons (rules that fired):"] + (_reason_lines(d.get("deny_reasons", [])) or ["  (none)"])
    approval_reasons = d["approval"].get("reasons", [])
    lines += ["approval required because:"] + (_reason_lines(approval_reasons) or ["  (not required)"])
    factors = [f"{f['name']} {f['points']:+d}" for f in d["risk"]["factors"]]
    lines.append(f"risk factors: {', '.join(factors) or '(none)'}")
    for key, title in (
        ("bindings_of_principal", "bindings of the principal"),
        ("bindings_applying_to_target", "bindings whose scope covers the target"),
        ("roles_granting", "roles granting the tool"),
        ("roles_denying", "roles denying the tool"),
        ("deny_rules_matching", "guardrails.deny_rules matching"),
        ("approval_rules_matching", "approval.rules matching"),
    ):
        lines.append(f"{title}: {', '.join(out[key]) or '(none)'}")
    quotas = [f"{q['name']} {q['used']}/{q['limit']}" for q in out["quotas_matching"]]
    lines.append(f"quotas matching (used/limit): {', '.join(quotas) or '(none)'}")
    lines.append(f"in a maintenance window: {out['in_maintenance_window']}; break-glass grant: {out['break_glass']}")
    lines.append(f"obligations: {json.dumps(d['obligations'])}")
    print("\n".join(lines))
    if "opa_explain" in out:
        print(f"\n--- opa eval --explain={args.opa_explain} data.pvegate.decision ---\n{out['opa_explain']}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("policy", help="policy author tools")
    psub = p.add_subparsers(dest="policy_command", required=True)
    e = psub.add_parser(
        "eval",
        help="print the decision for an input document (exit 1 when there is no policy answer: OPA did not start "
        "or answer, or the decision failed closed)",
        description="Print the decision for an input document; with --entrypoint visible_tools or approver the "
        "tools listed or the approver vote, as the gateway would act on them (the contract and the policy data "
        "check applied). Exit status: 0 a decision (allow, approval or "
        "deny), a listing or a vote (allowed or refused); 1 no policy answer (OPA did not start, refused the "
        "policy or bundle, or did not answer; a decision, listing or vote that failed closed is printed, and "
        "exits 1); 2 an unreadable input or a usage error.",
    )
    e.add_argument("--input", "-i", type=Path, required=True, help="input JSON file, or - for stdin")
    e.add_argument(
        "--entrypoint", choices=sorted(ENTRYPOINTS), default="decision", help="which policy entrypoint to ask"
    )
    e.add_argument(
        "--policies", type=Path, default=REPO_ROOT / "policies", help="policy directory for the temporary OPA"
    )
    e.add_argument("--bundle", type=Path, help="a bundle file instead of --policies")
    e.add_argument(
        "--verification-key", type=Path, help="public key the --bundle must be signed with (only with --bundle)"
    )
    e.add_argument("--opa-url", help="ask this running OPA (its API token, if any, in $PVEGATE_OPA_TOKEN)")
    e.set_defaults(func=key_needs_bundle(e, _eval))
    c = psub.add_parser(
        "check", help="check policy data against its schema, the policy's own checks and the gateway's tool catalog"
    )
    c.add_argument("--data", type=Path, help="the data file to check (default: <policies>/data/data.yaml)")
    c.add_argument(
        "--policies", type=Path, default=REPO_ROOT / "policies", help="policy directory (its schema and checks)"
    )
    c.add_argument(
        "--connectors",
        type=Path,
        help="the gateway's connector directory, whose tool catalog the data's tool, tool tag and argument names "
        f"are checked against (default: ${CONNECTORS_ENV}, else this installation's connectors/)",
    )
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(func=_check)
    x = psub.add_parser("explain", help="show the decision for an input and which rules fired")
    x.add_argument("--input", "-i", type=Path, required=True, help="input JSON (or a golden case file), - for stdin")
    x.add_argument("--policies", type=Path, default=REPO_ROOT / "policies", help="policy directory to decide with")
    x.add_argument("--data", type=Path, help="decide with this data file instead of <policies>/data/data.yaml")
    x.add_argument(
        "--opa-explain",
        choices=["notes", "fails", "full"],
        help="also print OPA's evaluation trace (opa eval --explain)",
    )
    x.add_argument("--json", action="store_true", help="print the explanation as JSON")
    x.set_defaults(func=_explain)
    register_replay(psub)
