"""`pvegate policy eval`: print OPA's decision for an input file, without an agent.

The answer comes from a real OPA: a temporary managed sidecar on the policy
directory or bundle, or an already running OPA given by --opa-url.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gateway.policy.decisions import APPROVER_PATH, DECISION_PATH, VISIBLE_TOOLS_PATH, DecisionClient, PolicyError
from gateway.policy.opa_sidecar import REPO_ROOT, OPASidecar, OPAUnavailable, client_token

ENTRYPOINTS = {"decision": DECISION_PATH, "visible_tools": VISIBLE_TOOLS_PATH, "approver": APPROVER_PATH}


async def _ask(url: str, entrypoint: str, doc: dict[str, Any], token: str | None) -> dict[str, Any]:
    client = DecisionClient(url, timeout_ms=5000, token=token)
    try:
        if entrypoint == "decision":
            d = await client.decide(doc)
            return {
                "allow": d.allow,
                "deny": list(d.deny),
                "deny_reasons": list(d.deny_reasons),
                "risk": d.risk,
                "approval": d.approval,
                "obligations": d.obligations,
                "quota": d.quota,
                "decision_id": d.decision_id,
                "bundle_revision": d.revision,
                "failed_closed": d.failed_closed,
            }
        result, _ = await client.query(ENTRYPOINTS[entrypoint], doc)
        return {"result": result}
    finally:
        await client.close()


def _eval(args: argparse.Namespace) -> int:
    try:
        raw = sys.stdin.read() if str(args.input) == "-" else args.input.read_text()
        doc = json.loads(raw)
    except (OSError, ValueError) as exc:
        print(f"error: cannot read input: {exc}", file=sys.stderr)
        return 2
    if isinstance(doc, dict) and len(doc) == 1:
        (only,) = doc.values()
        if isinstance(only, dict) and "input" in only:
            doc = only  # a golden-case file: {"<name>": {"name", "input", "expect"}}
    if isinstance(doc, dict) and "input" in doc and "contract_version" not in doc:
        doc = doc["input"]  # accept golden cases and OPA request bodies as they are
    sidecar: OPASidecar | None = None
    try:
        url = args.opa_url
        if url is None:
            sidecar = OPASidecar(policies=(args.policies,), bundle=args.bundle, verification_key=args.verification_key)
            sidecar.start()
            url = sidecar.url
        out = asyncio.run(_ask(url, args.entrypoint, doc, client_token(sidecar)))
    except (OPAUnavailable, PolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if sidecar is not None:
            sidecar.stop()
    print(json.dumps(out, indent=2))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("policy", help="policy author tools")
    psub = p.add_subparsers(dest="policy_command", required=True)
    e = psub.add_parser("eval", help="print the decision for an input document")
    e.add_argument("--input", "-i", type=Path, required=True, help="input JSON file, or - for stdin")
    e.add_argument(
        "--entrypoint", choices=sorted(ENTRYPOINTS), default="decision", help="which policy entrypoint to ask"
    )
    e.add_argument(
        "--policies", type=Path, default=REPO_ROOT / "policies", help="policy directory for the temporary OPA"
    )
    e.add_argument("--bundle", type=Path, help="a bundle file instead of --policies")
    e.add_argument("--verification-key", type=Path, help="public key the bundle must be signed with")
    e.add_argument("--opa-url", help="ask this running OPA (its API token, if any, in $PVEGATE_OPA_TOKEN)")
    e.set_defaults(func=_eval)
