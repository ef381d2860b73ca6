"""`pvegate policy replay`: which recorded decisions would a candidate policy change?

Registered under `pvegate policy` (policy.py calls `register_replay`). Exit status:
0 nothing past the --fail-on threshold, 1 past it (a CI gate) or a candidate answer that is no
verdict (undefined or outside the contract, whatever --fail-on says), or with --fail-on-redacted a
replayed input with redacted arguments, 2 the replay could not run
(among others: the audit does not verify, the candidate calls a network builtin, a candidate path
that is not there or holds no policy, --bundle with --policies/--data, a candidate that answers
nothing at all, no recorded decision selected without --allow-empty, a malformed export line, no
opa binary, an opa command that does not finish, a configuration that cannot be loaded, an --out that
cannot be written: checked before the replay runs). A configuration problem is never exit 1: that
would pass for a gate the candidate failed.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.commands.audit import db_path, key_path, parse_time, text_arg
from gateway.policy.errors import OPAUnavailable
from gateway.store.audit import verify
from gateway.store.replay import (
    ALIASES,
    KINDS,
    Candidate,
    EvalEngine,
    Filters,
    ReplayError,
    Report,
    ServerEngine,
    expand_kinds,
    read_audit,
    read_export,
    replay,
)


def key_needs_bundle(
    parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """`handler`, refusing --verification-key without --bundle as a usage error (exit 2): a policy
    directory carries no signature, and deciding with it anyway would pass for a verified answer."""

    def checked(args: argparse.Namespace) -> int:
        if args.verification_key is not None and args.bundle is None:
            parser.error("--verification-key needs --bundle: only a bundle carries a signature to verify")
        return handler(args)

    return checked


def _export_alone(
    parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """`handler`, refusing --export with an option only a database has (--db, --key, --archive,
    --checkpoint) as a usage error (exit 2): it would be ignored, and the report would not say so."""

    def checked(args: argparse.Namespace) -> int:
        if args.export is not None:
            given = [opt for opt, value in (("--db", args.db), ("--key", args.key), ("--archive", args.archive),
                                             ("--checkpoint", args.checkpoint)) if value]  # fmt: skip
            if given:
                parser.error(f"--export is not a database: {', '.join(given)} cannot be used with it")
        return handler(args)

    return checked


def writable(path: Path) -> str | None:
    """Why `path` cannot be written (None: it can be, as far as can be told without making it): asked
    before a long run, so that its result is not lost to a mistyped --out."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return "it is a directory"
    if not parent.is_dir():
        return f"there is no directory {parent}"
    if path.exists():
        return None if os.access(path, os.W_OK) else "permission denied"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"the directory {parent} cannot be written to"


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (a usage error otherwise, exit 2)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {n}")
        return n

    parse.__name__ = "positive integer" if minimum > 0 else "non-negative integer"
    return parse


def _kinds(text: str) -> str:
    """An argparse type: a --fail-on list naming at least one change kind (a usage error otherwise, exit
    2): a blank one would gate on nothing and pass. The names themselves are checked by expand_kinds."""
    if not any(name.strip() for name in text.split(",")):
        raise argparse.ArgumentTypeError(f"no change kind given: {text!r}; known: {', '.join((*KINDS, *ALIASES))}")
    return text


def _nothing_replayed(report: Report) -> str:
    s = report.skipped
    skipped = s.no_input + s.garbled + s.unknown_outcome + s.failed_closed
    if skipped:
        why = (
            f"all {skipped} selected record(s) were skipped (without a recorded input {s.no_input}, garbled "
            f"{s.garbled}, unknown outcome {s.unknown_outcome}, failed closed {s.failed_closed})"
        )
    else:
        why = "no decision record matches the source and filters (check --since/--until/--tool/--principal/--outcome)"
    return f"no recorded decision was replayed: {why}; --allow-empty accepts an empty replay"


def _run(args: argparse.Namespace) -> int:
    if args.out is not None and (why := writable(args.out)) is not None:
        print(f"error: cannot write the report to {args.out}: {why}", file=sys.stderr)
        return 2
    filters = Filters(
        since=args.since, until=args.until, tool=args.tool, principal=args.principal, outcome=args.outcome
    )
    try:
        fail_on = tuple(sorted(expand_kinds((args.fail_on or "").split(","))))
        candidate = Candidate(
            policies=tuple(args.policies or ()) + tuple(args.data or ()),
            bundle=args.bundle,
            verification_key=args.verification_key,
        )
        baseline = None
        if args.baseline_policies or args.baseline_data or args.baseline_bundle:
            baseline = Candidate(
                policies=tuple(args.baseline_policies or ()) + tuple(args.baseline_data or ()),
                bundle=args.baseline_bundle,
                verification_key=args.baseline_verification_key,
            )
        if args.export is not None:
            source = f"export {args.export}"
            report = Report(candidate.describe(), source, filters, fail_on=fail_on, fail_above=args.fail_above)
            report.integrity = "input: an export, not verified"  # an export carries no authenticated head
            records = read_export(args.export, filters, report.skipped)
        else:
            db = db_path(args)
            if isinstance(db, Path) and not db.is_file():
                raise ReplayError(f"no audit database at {db}")
            report = Report(candidate.describe(), f"audit {db}", filters, fail_on=fail_on, fail_above=args.fail_above)
            if args.no_verify:
                report.integrity = "audit NOT verified (--no-verify): records may have been removed or changed"
                records = read_audit(db, filters, report.skipped)
            else:
                # as `pvegate audit verify` does: the head key, recorded (or given) archives, a checkpoint
                result = verify(
                    db, [Path(a) for a in args.archive or ()], key=key_path(args), checkpoint=args.checkpoint
                )
                if result.unreachable:
                    raise ReplayError(f"cannot read the audit: {result.problem}")
                if not result.ok:
                    where = f" at record {result.bad_seq}" if result.bad_seq is not None else ""
                    raise ReplayError(
                        f"the audit does not verify{where}: {result.problem} "
                        "(see `pvegate audit verify`; --no-verify replays it anyway)"
                    )
                span = "no records" if result.first_seq is None else f"records {result.first_seq}..{result.last_seq}"
                report.integrity = f"audit verified: {span}, authenticated head {result.head_hash}"
                if result.checkpoint is not None:
                    report.integrity += f", checkpoint record {result.checkpoint} unchanged"
                report.verified = True
                records = read_audit(db, filters, report.skipped, verified=result)
        report.max_examples = args.examples
        report.fail_on_redacted = args.fail_on_redacted
        with candidate.staged() as run:  # exactly the files checked offline are the files that run
            engine: ServerEngine | EvalEngine = (
                EvalEngine(run) if args.engine == "eval" else ServerEngine(run, concurrency=args.concurrency)
            )
            with engine:
                replay(records, engine, report, baseline=baseline)
        if report.replayed == 0 and not args.allow_empty:  # a mistyped filter must not pass a gate
            raise ReplayError(_nothing_replayed(report))
    except BrokenPipeError:
        raise
    except (ReplayError, OSError, OPAUnavailable) as exc:  # (OPAUnavailable: no opa binary; a ConfigError: main)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired as exc:
        what = " ".join(map(str, exc.cmd[:2])) if isinstance(exc.cmd, list | tuple) else "opa"
        print(f"error: `{what}` did not finish within {exc.timeout:g} s", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # PostgreSQL's errors are sqlite3.OperationalError as well (pgsync)
        print(f"error: cannot read the audit: {exc}", file=sys.stderr)
        return 2
    text = (
        _json(report)
        if args.format == "json"
        else report.as_markdown()
        if args.format == "markdown"
        else report.as_text()
    )
    if args.out is not None:
        try:
            args.out.write_text(text)
        except OSError as exc:
            print(f"error: cannot write the report to {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print("\n".join(report.summary()))  # the summary on the console as well
    else:
        sys.stdout.write(text)
    return 1 if report.failed else 0


def _json(report: Report) -> str:
    import json

    return json.dumps(report.as_json(), indent=1) + "\n"


def register_replay(psub: Any) -> None:
    r = psub.add_parser(
        "replay",
        help="replay recorded decisions against a candidate policy and report what would change",
        description="Evaluate the policy inputs the audit recorded against a candidate (policy directory plus "
        "data, or a bundle) in a second OPA, and report every decision that changes: allow/approval/deny "
        "transitions, risk level, obligations and, where both sides need an approval, its terms (fewer or more "
        "approvers, approver groups added or removed, a longer or shorter approval ttl; approval-weakened names "
        "the weakening ones). Exit 0: nothing past the gate; 1: changes of a --fail-on kind "
        "exceed --fail-above, or the candidate gave an undefined or contract-breaking answer (whatever --fail-on "
        "says), or with --fail-on-redacted any replayed input had redacted arguments; 2: the replay could not run "
        "(the audit does not verify; a candidate path missing or without "
        "policy; --bundle with --policies/--data; a candidate answering nothing at all; no decision replayed "
        "without --allow-empty; an unreadable database or export; no opa binary, or an opa that does not finish; "
        "a configuration that cannot be loaded; an --out that cannot be written, checked before the replay runs).",
    )
    src = r.add_argument_group("recorded decisions")
    src.add_argument(
        "--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway's configuration (its audit.path)"
    )
    src.add_argument("--db", type=Path, help="the audit database (instead of reading it from --config)")
    src.add_argument(
        "--export",
        type=Path,
        help="a `pvegate audit export --jsonl` file instead of a database (it cannot be verified: the report says so)",
    )
    src.add_argument(
        "--key", type=Path, help="the audit head key file (default: audit.head_key_file, or audit-head.key by --db)"
    )
    src.add_argument("--archive", action="append", help="archive files (oldest first) to verify across the cut")
    src.add_argument(
        "--checkpoint", type=Path, help="a file from `audit checkpoint`: its record must be there, unchanged"
    )
    src.add_argument(
        "--no-verify",
        action="store_true",
        help="replay without verifying the audit's hash chain first (the report says: audit NOT verified)",
    )
    src.add_argument("--since", type=parse_time, help="e.g. 7d, 2h, or 2026-01-31T12:00")
    src.add_argument("--until", type=parse_time, help="only decisions before this time")
    src.add_argument("--tool", type=text_arg, help="a tool name, or a glob with *")
    src.add_argument("--principal", type=text_arg, help="a subject, or a glob with *")
    src.add_argument(
        "--outcome", choices=("allow", "pending", "deny"), help="only decisions recorded with this outcome"
    )
    src.add_argument(
        "--allow-empty",
        action="store_true",
        help="a replay of no decision (no record matches the filters) passes, instead of exiting 2",
    )
    cand = r.add_argument_group("candidate")
    cand.add_argument("--policies", type=Path, action="append", help="a policy directory (with its data/)")
    cand.add_argument(
        "--data", type=Path, action="append", help="more data files or directories, loaded as `opa run` loads them"
    )
    cand.add_argument("--bundle", type=Path, help="a bundle file instead of --policies and --data (not with them)")
    cand.add_argument(
        "--verification-key",
        type=Path,
        help="the --bundle's signature must verify against this key (only with --bundle)",
    )
    base = r.add_argument_group("baseline (approver votes, tool listings, console sections)")
    base.add_argument(
        "--baseline-policies",
        type=Path,
        action="append",
        help="the policy the records were decided by (a directory with its data/): the approver, tools/list and "
        "console questions built from the replayed decisions are asked of it and of the candidate, and each "
        "difference reported (without a baseline the report says they were not checked)",
    )
    base.add_argument(
        "--baseline-data", type=Path, action="append", help="more data files or directories of the baseline"
    )
    base.add_argument("--baseline-bundle", type=Path, help="the baseline as a bundle file")
    base.add_argument(
        "--baseline-verification-key",
        type=Path,
        help="the --baseline-bundle's signature must verify against this key (only with --baseline-bundle)",
    )
    out = r.add_argument_group("report and gate")
    out.add_argument("--format", choices=("text", "json", "markdown"), default="text", help="report format")
    out.add_argument("--out", "-o", type=Path, help="write the report to this file")
    out.add_argument("--examples", type=_count(0), default=3, help="examples per tool and principal")
    out.add_argument(
        "--fail-on",
        metavar="KINDS",
        type=_kinds,
        help=f"comma-separated change kinds that fail the run (exit 1): {', '.join((*KINDS, *ALIASES))}; "
        "an undefined or contract-breaking answer of the candidate fails it whatever this says",
    )
    out.add_argument(
        "--fail-above", type=_count(0), default=0, help="tolerate this many changes of the --fail-on kinds"
    )
    out.add_argument(
        "--fail-on-redacted",
        action="store_true",
        help="fail the run (exit 1) when any replayed input had redacted arguments: its verdict, changed or "
        "not, was reached on `[redacted]` values and is approximate (the report counts them either way)",
    )
    eng = r.add_argument_group("evaluation")
    eng.add_argument(
        "--engine",
        choices=("server", "eval"),
        default="server",
        help="ask a loopback `opa run --server`, or run `opa eval` per batch",
    )
    eng.add_argument("--concurrency", type=_count(1), default=4, help="batches in flight (server engine; at least 1)")
    r.set_defaults(func=key_needs_bundle(r, _export_alone(r, _run)))
