"""`pvegate approvals list | show | approve | deny | withdraw`, working on the database directly.

Approving and denying need the approver's identity, proven the same way as on
the admin API: the approver's own bearer JWT (--token-file, --token, or
$PVEGATE_APPROVER_TOKEN), verified with the gateway's auth configuration. There
is no "--as": local file access must not let anyone vote as someone else.
Whether that approver may vote on that request is asked of OPA
(data.pvegate.approver.decision): the gateway's configured external OPA, an
explicit --opa-url, or a temporary managed sidecar started for the command.
Withdrawing is an operator action (local access to the database suffices): it
only ever takes permission away.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.admin.reach import reached
from gateway.core.config import Config, load
from gateway.core.text import one_line, visible
from gateway.mcp.wellknown import token_resource
from gateway.policy.opa_sidecar import client_token
from gateway.store.approvals import MAX_PAGE, Approvals, ApprovalStore, BadCursor, NotFound, VoteOutcome
from gateway.store.audit import AuditLog, known_secrets
from gateway.store.backend import refuse_unshared
from gateway.store.db import database
from gateway.store.pgsync import audit_location

TOKEN_ENV = "PVEGATE_APPROVER_TOKEN"  # noqa: S105 - the name of a variable, not a secret
# --note: what the admin API and the console take (gateway/admin/api.py note_problem)
NOTE_RULE = "at most 1000 characters; no control characters but tab and line breaks"


def _opa_note(args: argparse.Namespace, cfg: Config) -> dict[str, Any] | None:
    """What the vote's record says of an --opa-url that is not the configured OPA (None: the configured one)."""
    url = getattr(args, "opa_url", None)
    if url is None:
        return None
    configured = cfg.opa.url if cfg.opa.mode == "external" else None
    if configured is not None and url.rstrip("/") == configured.rstrip("/"):
        return None
    return {"url": url, "chosen_by": "--opa-url", "configured": configured or "managed sidecar"}


class Unusable(Exception):
    """The database (or the audit in it) cannot be used: one line for the operator."""


def refuse_missing(cfg: Config) -> None:
    """A SQLite database that is not there is not made here (a typo in --config would make a new, empty one
    with a new audit head key): said, as `pvegate audit tail` says it."""
    if not cfg.storage.postgresql and not cfg.audit_path.exists():
        raise Unusable(
            f"no database at {cfg.audit_path} (the gateway makes it at its first start; is --config the "
            "gateway's configuration?)"
        )


async def _run(args: argparse.Namespace, cfg: Config, need_opa: bool, fn: Callable[[Approvals], Awaitable[int]]) -> int:
    from gateway.policy.decisions import DecisionClient

    refuse_unshared(cfg)  # the gateway would not run on this storage.url: neither do its tools
    refuse_missing(cfg)
    audit = AuditLog(audit_location(cfg), secrets=known_secrets(cfg), head_key=cfg.audit_key_path)
    store = ApprovalStore(database(cfg))
    sidecar = None
    decisions = None
    # each store is closed whatever fails once it is open (the other's opening too): aiosqlite's thread,
    # left open, keeps the process from exiting after its error was said
    await audit.open()
    try:
        await store.open()
        try:
            if need_opa:
                url, token = args.opa_url, client_token(None)
                if url is None:
                    from gateway.app import opa_api_token, start_opa

                    url, sidecar = await asyncio.to_thread(lambda: start_opa(cfg, gateway=False))
                    token = opa_api_token(cfg, sidecar)
                decisions = DecisionClient(url, max(cfg.opa.timeout_ms, 2000), token=token)
            base = cfg.public_url if cfg.admin.token is not None else None
            note = _opa_note(args, cfg) if need_opa else None
            approvals = Approvals(store, audit, decisions, page_base=base, config_path=str(args.config), opa_note=note)
            await approvals.expire_due()
            return await fn(approvals)
        finally:
            if decisions is not None:
                await decisions.close()
            await store.close()
    finally:
        await audit.close()
        if sidecar is not None:
            sidecar.stop()


class _TokenFile(Exception):
    """--token-file cannot be read: a credential error (exit 2)."""


def _approver_token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if isinstance(exc, UnicodeDecodeError):
                why = "it is not UTF-8 text (a JWT is ASCII)"
            raise _TokenFile(f"cannot read --token-file {args.token_file}: {why}") from None
    if args.token:
        return str(args.token).strip()
    return os.environ.get(TOKEN_ENV, "").strip() or None


def _shown(value: Any) -> str:
    """Stored text as one line a terminal shows as it is: a requester's sub, a guest's name, a policy's reason
    or an approver's note with an ANSI escape, a line break or a bidi override would otherwise rewrite what
    the approver reads (a forged "approvers:" line, a hidden argument)."""
    return one_line(visible(str(value)))


def _print_request(view: dict[str, Any], impact: str | None = None) -> None:
    t = view["target"]
    tdesc = "/".join(_shown(t.get(k)) for k in ("cluster", "node", "vmid") if t.get(k) is not None)
    print(f"{view['id']}  {view['state']}")
    print(f"  requester:  {_shown(view['requester'])}")
    name = f" ({_shown(t['name'])})" if t.get("name") else ""
    print(f"  tool:       {_shown(view['tool'])}  on {tdesc or '-'}{name}")
    if t.get("vmid") is not None:  # the target guest's pool and tags: what a scope or a tag rule selected
        tags = t.get("tags") if isinstance(t.get("tags"), list) else []
        pool = t.get("pool") if t.get("pool") is not None else "none" if t.get("pool_known", True) else "not known"
        print(f"  guest:      pool {_shown(pool)}; tags {_shown(', '.join(str(x) for x in tags) or 'none')}")
    for what, text in reached(t):  # the guests it reaches beyond its target: the approval is bound to them
        print(f"  {what + ':':11} {_shown(text)}")
    print(f"  arguments:  {json.dumps(view['arguments'], sort_keys=True)}")
    if impact is not None:
        print(f"  would:      {_shown(impact)}")
    print(f"  digest:     {view['arguments_digest']}")
    print(f"  risk:       {_shown(view['risk'].get('level', '?'))} (score {_shown(view['risk'].get('score', '?'))})")
    for f in view["risk"].get("factors") or []:
        if isinstance(f, dict):
            print(f"    {_shown(f.get('name', ''))} (+{_shown(f.get('points', '?'))}) {_shown(f.get('why', ''))}")
    print(f"  reason:     {_shown(view['reason'])}")
    got = ", ".join(_shown(a["approver"]) for a in view["approvals"]) or "none"
    groups = ", ".join(_shown(g) for g in view["approver_groups"]) or "-"
    print(f"  approvers:  groups {groups}; needs {view['min_approvals']}; has {got}")
    print(f"  created:    {view['created_at']}   expires: {view['expires_at']}")
    if view["decided_at"]:
        print(
            f"  decided:    {view['decided_at']} by {_shown(view['decided_by'])}"
            + (f": {_shown(view['note'])}" if view["note"] else "")
        )
    if view["used_at"]:
        print(f"  used:       {view['used_at']} by request {view['used_by_request']}")


def _impact(cfg: Config, view: dict[str, Any]) -> str | None:
    """The tool's dry-run sentence with the call's values (as the console's preview says it): what Proxmox
    is asked to do. The arguments are the stored ones (secrets already masked); the node and type are the
    target's, where the connector would locate the guest. None when the catalog cannot tell."""
    from gateway.tools.catalog import Catalog, CatalogError
    from gateway.tools.runtimes.pve_api import dry_run_text

    try:
        tool = Catalog.load(cfg.connectors_dir).get(str(view["tool"]))
    except (CatalogError, OSError):
        return None
    if tool is None:
        return "(the tool is no longer in the catalog)"
    t = view["target"]
    located = {k: t[k] for k in ("node", "type") if t.get(k) is not None}
    values = {**view["arguments"], **located} if isinstance(view["arguments"], dict) else located
    return dry_run_text(tool, values) or None


def _outcome(out: VoteOutcome, verdict: str) -> int:
    if not out.ok:
        print(f"refused: {'; '.join(out.reasons)}", file=sys.stderr)
        return 1
    if out.token:
        print(f"approved: {out.approvals}/{out.needed} approvals; the request is now approved.")
        print("one-time approval token (shown once, stored only as a hash):")
        print(f"  {out.token}")
        print('the agent retries the same call with it in params._meta["pvegate/approval"]')
    elif verdict == "approve":
        print(f"approval recorded: {out.approvals}/{out.needed}; waiting for more approvers")
    else:
        print(f"{out.state}")
    return 0


def _page_size(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PAGE:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_PAGE}")
    return n


def _note(text: str) -> str:
    """--note: the notes the admin API and the console take (no control characters but tab and line breaks, at
    most NOTE_MAX_CHARS), refused before anything changes: stored, it is printed raw by `show` and the console."""
    from gateway.admin.api import note_problem

    if (problem := note_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _list(args: argparse.Namespace) -> int:
    cfg = load(args.config)

    async def go(a: Approvals) -> int:
        assert a.store is not None
        try:
            items, nxt = await a.store.page(None if args.state == "all" else [args.state], args.limit, args.cursor)
        except BadCursor as exc:
            print(f"error: --cursor: {exc}", file=sys.stderr)
            return 2
        if nxt is not None:  # on stderr: the JSON array and the lines stay what they were
            print(f"more requests: --cursor {nxt}", file=sys.stderr)
        if args.json:
            print(json.dumps([r.view() for r in items], indent=1))
            return 0
        for r in items:
            v = r.view()
            print(
                f"{v['id']}  {v['state']:9}  {_shown(v['requester']):16}  {_shown(v['tool']):22}  "
                f"{len(v['approvals'])}/{v['min_approvals']}  expires {v['expires_at']}"
            )
        if not items:
            print(f"no {args.state} approval requests", file=sys.stderr)
        return 0

    return _guard(cfg, lambda: asyncio.run(_run(args, cfg, False, go)))


def _show(args: argparse.Namespace) -> int:
    cfg = load(args.config)

    async def go(a: Approvals) -> int:
        assert a.store is not None
        view = (await a.store.get(args.id)).view()
        if args.json:
            print(json.dumps(view, indent=1))
        else:
            _print_request(view, _impact(cfg, view))
        return 0

    return _guard(cfg, lambda: asyncio.run(_run(args, cfg, False, go)))


def _vote(verdict: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from gateway.auth.tokens import Authenticator, AuthError

        cfg = load(args.config)
        try:
            token = _approver_token(args)
        except _TokenFile as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not token:
            print(
                f"error: {verdict} needs your own approver token: --token-file, --token or ${TOKEN_ENV}",
                file=sys.stderr,
            )
            return 2

        async def go(a: Approvals) -> int:
            try:
                who = await Authenticator(cfg.auth, resource=token_resource(cfg)).authenticate(f"Bearer {token}")
            except AuthError as exc:
                print(f"error: approver token rejected: {exc}", file=sys.stderr)
                return 2
            from gateway.admin.api import bearer_auth_time

            out = await a.decide(args.id, who, verdict, args.note, auth_time=bearer_auth_time(token))
            return _outcome(out, verdict)

        return _guard(cfg, lambda: asyncio.run(_run(args, cfg, True, go)))

    return handler


def _withdraw(args: argparse.Namespace) -> int:
    cfg = load(args.config)

    async def go(a: Approvals) -> int:
        who = f"operator:{os.environ.get('USER', 'local')}"
        return _outcome(await a.withdraw(args.id, who, args.note), "withdraw")

    return _guard(cfg, lambda: asyncio.run(_run(args, cfg, False, go)))


def _guard(cfg: Config, fn: Callable[[], int]) -> int:
    """Run a command; a request that is not there is exit 4, a database (or audit) that cannot be used one
    line and exit 1 (the traceback only for what is a bug)."""
    from gateway.policy.errors import OPAUnavailable
    from gateway.store.audit import AuditIntegrityError, AuditStoreError
    from gateway.store.migrate import describe

    try:
        return fn()
    except NotFound as exc:
        print(f"error: no approval request {exc}", file=sys.stderr)
        return 4
    except BrokenPipeError:
        raise  # the reader went away: main() ends quietly
    except (Unusable, AuditStoreError, AuditIntegrityError, OPAUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the database's (or the audit's) own refusal, as one line
        why = describe(exc, local=not cfg.storage.postgresql)
        if why is None:
            raise
        print(f"error: cannot use the database: {why}", file=sys.stderr)
        return 1


def register(sub: Any) -> None:
    a = sub.add_parser("approvals", help="list, inspect, approve, deny or withdraw approval requests")
    asub = a.add_subparsers(dest="approvals_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            "-c",
            type=Path,
            default=Path("pvegate.yaml"),
            help="the gateway configuration file",
        )

    ls = asub.add_parser("list", help="approval requests (pending by default)")
    common(ls)
    ls.add_argument(
        "--state",
        default="pending",
        choices=["pending", "approved", "denied", "withdrawn", "expired", "used", "all"],
        help="which requests to list",
    )
    ls.add_argument("--json", action="store_true", help="a JSON array instead of one line per request")
    ls.add_argument(
        "--limit",
        type=_page_size,
        default=200,
        help=f"requests per page (1 to {MAX_PAGE}); pending ones come first, soonest-expiring first",
    )
    ls.add_argument("--cursor", help="the next page, as the previous page's 'more requests: --cursor ...' gave it")
    ls.set_defaults(func=_list)

    sh = asub.add_parser("show", help="one request with its votes")
    common(sh)
    sh.add_argument("id", help="the approval request id (apr-...)")
    sh.add_argument("--json", action="store_true", help="the request as JSON")
    sh.set_defaults(func=_show)

    for verdict, help_ in (("approve", "approve a request (as yourself)"), ("deny", "deny a request (as yourself)")):
        v = asub.add_parser(verdict, help=help_)
        common(v)
        v.add_argument("id", help="the approval request id (apr-...)")
        v.add_argument("--token-file", type=Path, help="file holding your approver JWT")
        v.add_argument("--token", help=f"your approver JWT (prefer --token-file or ${TOKEN_ENV})")
        v.add_argument(
            "--opa-url",
            help="ask this OPA instead of starting a temporary sidecar (its API token, if any, in $PVEGATE_OPA_TOKEN)",
        )
        v.add_argument("--note", type=_note, help=f"a note recorded with the vote ({NOTE_RULE})")
        v.set_defaults(func=_vote(verdict))

    w = asub.add_parser("withdraw", help="withdraw a pending or approved request (operator)")
    common(w)
    w.add_argument("id", help="the approval request id (apr-...)")
    w.add_argument("--note", type=_note, help=f"why, recorded with the withdrawal ({NOTE_RULE})")
    w.set_defaults(func=_withdraw)
