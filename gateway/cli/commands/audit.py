"""`pvegate audit verify | checkpoint | tail | search | export | archive`: the operator's view of the audit log.

All subcommands read the database directly (read-only, except `archive`): the SQLite file,
or the PostgreSQL database storage.url names, so they work whether or not a gateway runs.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import sqlite3
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.core.text import one_line
from gateway.store import audit as auditlib
from gateway.store.audit_seal import AuditKeyError
from gateway.store.pgsync import PgLocation, audit_location

_REL = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SHOWN_LIMIT = 2000  # characters of one shown column, after escaping


def parse_time(text: str, now: float | None = None) -> float:
    """A relative age ("15m", "2h", "7d": that long ago) or an ISO 8601 time (UTC if no zone)."""
    now = time.time() if now is None else now
    m = _REL.match(text.strip())
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (use e.g. 30m, 2h, 7d or 2026-01-31T12:00)") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# The largest count a query can carry: SQLite's INTEGER and PostgreSQL's bigint (a LIMIT) stop at 2**63 - 1
MAX_COUNT = 2**63 - 1


def positive_int(text: str) -> int:
    """An argparse type: an integer from 1 to MAX_COUNT (a usage error otherwise, exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {n}")
    if n > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_COUNT}: {n}")
    return n


def text_arg(text: str) -> str:
    """An argparse type: text a query can carry (an argument that is not UTF-8 in this locale arrives with
    lone surrogates, which no record holds and no database takes): a usage error otherwise, exit 2."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"not UTF-8 text: {text!a}") from None
    return text


def parse_age(text: str) -> float:
    m = _REL.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not an age: {text!r} (use e.g. 90d, 12h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def db_path(args: argparse.Namespace) -> Path | PgLocation:
    """--db, else where the configuration's storage.url puts the audit (a SQLite file or PostgreSQL)."""
    from gateway.core.config import load

    where: Path | PgLocation = Path(args.db) if args.db is not None else audit_location(load(args.config))
    if isinstance(where, Path) and where.is_dir():  # SQLite would say only "disk I/O error"
        raise NotAnAuditDatabase(f"{where} is a directory, not an audit database")
    return where


class NotAnAuditDatabase(OSError):
    """The audit path names something that is no database file (a directory): one sentence, no errno."""


def key_path(args: argparse.Namespace) -> Path:
    """The audit head key: --key, else the configuration's, else audit-head.key next to --db."""
    if getattr(args, "key", None) is not None:
        return Path(args.key)
    if args.db is not None:
        return Path(args.db).parent / "audit-head.key"
    from gateway.core.config import load

    return load(args.config).audit_key_path


def _archive_defaults(args: argparse.Namespace) -> tuple[float | None, Path | None]:
    """(age in seconds, archive directory) from the configuration, when --db is not used."""
    if args.db is not None:
        return None, None
    from gateway.core.config import load

    cfg = load(args.config)
    days = cfg.audit_retention_days
    return (days * 86400 if days else None), cfg.audit_archive_dir or cfg.audit_path.parent / "audit-archive"


def _query(args: argparse.Namespace, **kw: Any) -> auditlib.Query:
    return auditlib.Query(
        principal=args.principal,
        tool=args.tool,
        target=args.target,
        outcome=args.outcome,
        kind=args.kind,
        request_id=args.request_id,
        since=args.since,
        until=args.until,
        **kw,
    )


def _field(value: Any) -> str:
    """One shown column: client-supplied text (a tool name, a target, an argument name in a denial) has its
    newlines and terminal escapes escaped, so a record can neither forge a listing line nor repaint a terminal."""
    return one_line(value if isinstance(value, str) else str(value), limit=SHOWN_LIMIT)


def _texts(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _OddBody
    return value


class _OddBody(Exception):
    """A body that is a JSON object, but not of the shape pvegate writes for its kind (`deny: [1]`)."""


def _detail(kind: str, body: dict[str, Any]) -> str:
    """The short detail of one record of `kind`; _OddBody when the body is not of the shape pvegate writes."""
    detail = ""
    if kind == "decision":
        risk = body.get("risk") or {}
        if not isinstance(risk, dict):
            raise _OddBody
        detail = "; ".join(_texts(body.get("deny") or [])) or str(risk.get("level") or "")
    elif kind in ("refusal", "auth_failure"):
        detail = str(body.get("error") or body.get("reason") or "")
    elif kind == "result":
        detail = f"{body.get('duration_ms')} ms" + (f" task {body['task_id']}" if body.get("task_id") else "")
        detail += f" {body['error']}" if body.get("error") else ""
    elif kind == "approval":
        detail = str(body.get("approval_id") or "")
    elif kind == "dispatch":
        detail = f"task {body['task_id']}" if body.get("task_id") else f"node {body.get('node')}"
    if kind == "result" and body.get("proxmox"):  # reconciled: what Proxmox says happened
        detail += f" proxmox {body['proxmox']}" + (f" ({body['exitstatus']})" if body.get("exitstatus") else "")
    return detail


def _line(row: dict[str, Any]) -> str:
    damaged = auditlib.damage(row)
    if damaged is not None:  # listed, and said, with what can be shown: a listing goes on
        cols = [
            auditlib._shown(row.get(c)) if row.get(c) is not None else "-" for c in ("seq", "ts", "kind", "outcome")
        ]
        who = [auditlib._shown(row.get(c)) if row.get(c) is not None else "-" for c in ("principal", "tool", "target")]
        rid = auditlib._shown(row.get("request_id"))
        return "  ".join([*cols, *who, rid, f"(damaged: {one_line(damaged)}: run `pvegate audit verify`)"])
    when = datetime.fromtimestamp(row["ts"], tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    body: dict[str, Any] | None
    try:
        body = auditlib.parse_body(row)
    except auditlib.AuditDataError:  # shown, and said: a listing goes on
        body = None
    if body is None:
        detail = "(its body is not a JSON object: run `pvegate audit verify`)"
    else:
        try:
            detail = _field(_detail(row["kind"], body))
        except _OddBody:  # listed, and said: pvegate never writes such a body
            detail = f"(damaged: its body is not shaped like a {_field(row['kind'])} record pvegate writes)"
    cols = [
        str(row["seq"]),
        when,
        *(_field(row[c] or "-") for c in ("kind", "outcome", "principal", "tool", "target")),
        _field(row["request_id"]),
        detail,
    ]
    return "  ".join(cols).rstrip()


# `pvegate audit verify`: 0 verified, 1 it does not verify (FAILED ...), 2 it could not be checked at all
VERIFY_CANNOT_CHECK = 2


def _verify(args: argparse.Namespace) -> int:
    try:
        db = db_path(args)  # a configuration that cannot be loaded: main() says it, exit 2
    except NotAnAuditDatabase as exc:
        # as for a missing file: the database may have been deleted or replaced, a finding (exit 1), never
        # "cannot check"; the sentence says what is there instead
        result = auditlib.VerifyResult(ok=False, checked=0, problem=str(exc))
    else:
        key = key_path(args)
        result = auditlib.verify(db, [Path(a) for a in args.archive or []], key=key, checkpoint=args.checkpoint)
    if result.unreachable:  # nothing was checked: not a finding about the audit (PostgreSQL down, ...)
        if args.json:
            print(json.dumps(result.as_dict(), indent=1))
        print(f"error: cannot verify: {result.problem}", file=sys.stderr)
        return VERIFY_CANNOT_CHECK
    if args.json:
        print(json.dumps(result.as_dict(), indent=1))
    elif result.ok:
        span = f"records {result.first_seq}..{result.last_seq}" if result.first_seq is not None else "no records"
        anchor = ""
        if result.anchor:
            anchor = f" (continuing from archived record {result.anchor['seq']}, {len(result.archives)} archive(s))"
        print(f"OK: {result.checked} records verified, {span}{anchor}; authenticated head {result.head_hash}")
        if result.checkpoint is not None:
            print(f"the checkpoint's record {result.checkpoint} is present and unchanged")
        if result.high_water is not None:
            mark = f"the high-water mark ({result.high_water_file}) is record {result.high_water}"
            print(f"{mark}: the head is not below it")
        if result.sealed_at is not None:
            print(f"(records up to {result.sealed_at} were written before the chain head was keyed)")
    else:
        where = f" at record {result.bad_seq}" if result.bad_seq is not None else ""
        print(f"FAILED{where}: {result.problem}", file=sys.stderr)
        print(f"({result.checked} records verified before it)", file=sys.stderr)
    return 0 if result.ok else 1


def _checkpoint(args: argparse.Namespace) -> int:
    try:
        doc = auditlib.checkpoint(db_path(args), key=key_path(args))
    except BrokenPipeError:
        raise
    except (AuditKeyError, auditlib.AuditIntegrityError, OSError, sqlite3.Error) as exc:
        print(f"error: no checkpoint: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(doc, indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            args.out.write_text(text)
        except OSError as exc:
            print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"checkpoint of record {doc['seq']} written to {args.out}", file=sys.stderr)
    return 0


def _readable(fn: Any) -> Any:
    """A reading command: a store that cannot be read (no file, a directory, PostgreSQL down) is a sentence,
    exit 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            result: int = fn(args)
        except BrokenPipeError:
            raise  # the reader went away (`| head`): main() ends quietly, as for every command
        except (sqlite3.Error, OSError) as exc:  # (a configuration that cannot be loaded: main() says it)
            print(f"error: cannot read the audit: {exc}", file=sys.stderr)
            return 1
        except auditlib.AuditDataError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return result

    return run


@_readable
def _tail(args: argparse.Namespace) -> int:
    path = db_path(args)
    rows = auditlib.search(path, _query(args, limit=args.n, newest_first=True))
    last = 0
    for row in rows:
        print(_line(row) if not args.jsonl else auditlib.export_line(row))
        last = row["seq"]
    while args.follow:
        time.sleep(0.5)
        for row in auditlib.iter_rows(path, _query(args, after_seq=last)):
            print(_line(row) if not args.jsonl else auditlib.export_line(row), flush=True)
            last = row["seq"]
    return 0


@_readable
def _search(args: argparse.Namespace) -> int:
    n = 0
    for row in auditlib.iter_rows(db_path(args), _query(args, limit=args.limit)):
        print(auditlib.export_line(row) if args.jsonl else _line(row))
        n += 1
    if not args.jsonl:
        print(f"({n} records)", file=sys.stderr)
    return 0


@_readable
def _export(args: argparse.Namespace) -> int:
    if not args.jsonl:
        print("error: only --jsonl export is supported", file=sys.stderr)
        return 2
    if args.out is None:  # stdout: a record that cannot be exported stops it, said on stderr, exit 1
        n = 0
        for row in auditlib.iter_rows(db_path(args), _query(args)):
            sys.stdout.write(auditlib.export_line(row) + "\n")
            n += 1
        print(f"exported {n} records", file=sys.stderr)
        return 0
    if args.out.is_dir():  # said before the audit is read; `.` and `/` have no name to write a file aside of
        print(f"error: cannot write {args.out}: {os.strerror(errno.EISDIR)}; nothing was written", file=sys.stderr)
        return 1
    # a file: written aside and put in place whole, so an export that stops leaves no partial file behind
    tmp = args.out.with_name(f".{args.out.name}.partial")
    try:
        try:
            tmp.unlink(missing_ok=True)  # left by an export that was killed
            out = auditlib.private_file(tmp)  # 0600 whatever the umask: it holds what the database holds
        except OSError as exc:
            raise _Unwritable(exc) from exc
        with out:
            n = 0
            for row in auditlib.iter_rows(db_path(args), _query(args)):
                try:
                    out.write(auditlib.export_line(row) + "\n")
                except OSError as exc:
                    raise _Unwritable(exc) from exc
                n += 1
            try:
                out.flush()  # a full disk said here, as the output's, not by the close
            except OSError as exc:
                raise _Unwritable(exc) from exc
        try:
            tmp.replace(args.out)
        except OSError as exc:
            raise _Unwritable(exc) from exc
    except _Unwritable as exc:  # the output's problem, not the audit's; never the temporary file's name
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        why = exc.cause.strerror or str(exc.cause)
        print(f"error: cannot write {args.out}: {why}; nothing was written", file=sys.stderr)
        return 1
    except auditlib.AuditDataError as exc:
        tmp.unlink(missing_ok=True)
        print(f"error: {exc}; nothing was written to {args.out}", file=sys.stderr)
        return 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    print(f"exported {n} records", file=sys.stderr)
    return 0


class _Unwritable(Exception):
    """The export's output file could not be written (the audit itself was read fine)."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _archive(args: argparse.Namespace) -> int:
    try:
        path = db_path(args)
    except NotAnAuditDatabase as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    age, conf_dir = _archive_defaults(args)
    age = args.older_than if args.older_than is not None else age
    if age is None:
        print("error: give --older-than, or set audit.retention_days in the configuration", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir) if args.out_dir else conf_dir or Path(str(path)).parent / "audit-archive"
    if age < auditlib.CLAIM_MARGIN_SECONDS * 2:
        print(
            "warning: archiving records less than two hours old: a call decided after this archive is reconciled "
            "against the task claims of the hour before it, and those archived can no longer keep another "
            "call's task from being taken for its own",
            file=sys.stderr,
        )
    try:
        res = auditlib.archive(path, time.time() - age, out_dir, key=key_path(args))
    except (ValueError, AuditKeyError, auditlib.AuditIntegrityError, sqlite3.Error, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if res.file is None:
        print("nothing to archive")
        return 0
    print(f"archived records {res.first_seq}..{res.last_seq} ({res.count}) to {res.file}")
    print(f"the database now continues from anchor record {res.last_seq} (hash {res.last_hash})")
    print(f"verify across the cut with: pvegate audit verify --archive {res.file}")
    return 0


def _store_failure(exc: BaseException, *, local: bool) -> str | None:
    """Why the audit or the database cannot be used, as one sentence; None for an error that is a bug."""
    from gateway.store.migrate import describe

    if isinstance(exc, auditlib.AuditStoreError | auditlib.AuditIntegrityError):
        return str(exc)
    return describe(exc, local=local)


def _reconcile(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.cli.commands.approvals import Unusable, refuse_missing
    from gateway.components import default_grace
    from gateway.core.config import load
    from gateway.store.audit import AuditLog, known_secrets
    from gateway.store.holds import build_holds
    from gateway.store.outcomes import Outcomes
    from gateway.store.reconcile import RECONCILE_LOCK, Reconciler, summary
    from gateway.tools.catalog import Catalog
    from gateway.tools.runtimes.pve_api import PveApiClient

    cfg = load(args.config)
    try:  # a SQLite file that is not there is not made (a new, empty chain with a new key): said, as `approvals list`
        refuse_missing(cfg)
    except Unusable as exc:
        print(f"error: nothing was reconciled: {exc}", file=sys.stderr)
        return 1
    catalog = Catalog.load(cfg.connectors_dir)
    grace = cfg.shutdown_grace_seconds if cfg.shutdown_grace_seconds is not None else default_grace(catalog)
    # calls younger than the grace period may still be in flight in a running gateway: not touched by default
    min_age = args.min_age if args.min_age is not None else grace

    async def run() -> list[Any] | None:
        audit = AuditLog(audit_location(cfg), secrets=known_secrets(cfg), head_key=cfg.audit_key_path)
        await audit.open()
        clients = {name: PveApiClient(cl) for name, cl in cfg.clusters.items()}
        try:
            holds = await build_holds(cfg)  # PostgreSQL: the replicas' pool holds (SQLite: a running gateway's own)
        except BaseException:
            await audit.close()
            raise
        try:
            outcomes = Outcomes(audit, grace_seconds=grace, min_free_bytes=0)
            outcomes.on_settled, outcomes.on_running = holds.give_back_call, holds.renew_call
            reconciler = Reconciler(cfg, catalog, outcomes, clients)
            # the replicas' rule (PostgreSQL): one reconciler at a time, so no call is settled twice
            deadline = time.monotonic() + args.wait
            while True:
                async with audit.exclusive(RECONCILE_LOCK) as turn:
                    if turn:
                        return await reconciler.run_once(time.time() - min_age, since=args.since, turn=turn)
                if time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        finally:
            await holds.close()
            for c in clients.values():
                await c.close()
            await audit.close()

    try:
        settled = asyncio.run(run())
    except BrokenPipeError:
        raise
    except Exception as exc:  # the audit or the database cannot be used: one line (a bug keeps its traceback)
        why = _store_failure(exc, local=not cfg.storage.postgresql)
        if why is None:
            raise
        print(f"error: nothing was reconciled: {why}", file=sys.stderr)
        return 1
    if settled is None:
        print(
            f"error: another gateway replica is reconciling (it holds the {RECONCILE_LOCK} lock) and did not "
            f"finish within {args.wait:g} s: try again later, or with a longer --wait",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps([s.as_dict() for s in settled], indent=1))
    else:
        for s in settled:
            extra = " ".join(_field(x) for x in (s.proxmox, s.task_id, s.detail) if x)
            print(f"{_field(s.request_id)}  {_field(s.tool or '-')}  {_field(s.action)}  {extra}".rstrip())
        print(summary(settled), file=sys.stderr)
    return 1 if any(s.action == "open" for s in settled) else 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        type=Path,
        default=Path("pvegate.yaml"),
        help="the gateway configuration file",
    )
    p.add_argument("--db", type=Path, help="the audit database file (instead of reading it from --config)")


def _key(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--key", type=Path, help="the audit head key file (default: audit.head_key_file, or audit-head.key by --db)"
    )


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--principal", type=text_arg, help="exact subject, or a glob with *")
    p.add_argument("--tool", type=text_arg, help="exact tool name")
    p.add_argument("--target", type=text_arg, help="e.g. default/qemu/101, or a glob: 'default/*'")
    p.add_argument("--outcome", type=text_arg, help="allow, deny, pending, ok, failed, invalid, approval_refused, ...")
    p.add_argument("--kind", type=text_arg, help="received, decision, result, refusal, auth_failure, approval")
    p.add_argument("--request-id", dest="request_id", type=text_arg, help="all records of one request")
    p.add_argument("--since", type=parse_time, help="e.g. 2h, 7d, or 2026-01-31T12:00")
    p.add_argument("--until", type=parse_time, help="end of the time range, same forms as --since")


def register(sub: Any) -> None:
    a = sub.add_parser("audit", help="verify, read and archive the audit log")
    asub = a.add_subparsers(dest="audit_command", required=True)

    v = asub.add_parser(
        "verify",
        help="check the hash chain; exits 1 naming the first bad record, 2 when it cannot be checked at all "
        "(a configuration that cannot be loaded, a PostgreSQL database that cannot be connected to)",
    )
    _common(v)
    v.add_argument("--archive", action="append", help="archive files (oldest first) to verify across the cut")
    v.add_argument(
        "--checkpoint", type=Path, help="a file from `audit checkpoint`: its record must be there, unchanged"
    )
    _key(v)
    v.add_argument("--json", action="store_true", help="the result as JSON")
    v.set_defaults(func=_verify)

    cp = asub.add_parser("checkpoint", help="export the authenticated chain head (JSON), to keep off the host")
    _common(cp)
    _key(cp)
    cp.add_argument("--out", "-o", type=Path, help="write it to this file (default: stdout)")
    cp.set_defaults(func=_checkpoint)

    t = asub.add_parser("tail", help="the latest records")
    _common(t)
    _filters(t)
    t.add_argument("-n", type=positive_int, default=20, help="how many records (at least 1)")
    t.add_argument("--follow", "-f", action="store_true", help="keep printing new records as they are written")
    t.add_argument("--jsonl", action="store_true", help="one JSON object per line")
    t.set_defaults(func=_tail)

    s = asub.add_parser("search", help="records by principal, tool, target, outcome, time range")
    _common(s)
    _filters(s)
    s.add_argument("--limit", type=positive_int, default=1000, help="at most this many records (at least 1)")
    s.add_argument("--jsonl", action="store_true", help="one JSON object per line")
    s.set_defaults(func=_search)

    e = asub.add_parser("export", help="export records for a SIEM")
    _common(e)
    _filters(e)
    e.add_argument("--jsonl", action="store_true", help="one JSON object per line (with hashes)")
    e.add_argument("--out", "-o", type=Path, help="write to this file (default: stdout)")
    e.set_defaults(func=_export)

    r = asub.add_parser("archive", help="move old records to a JSONL archive, keeping the chain verifiable")
    _common(r)
    r.add_argument("--older-than", type=parse_age, help="e.g. 90d (default: audit.retention_days)")
    r.add_argument("--out-dir", type=Path, help="default: audit.archive_dir, or audit-archive/ next to the database")
    _key(r)
    r.set_defaults(func=_archive)

    rc = asub.add_parser(
        "reconcile", help="settle allowed calls without a result (killed, cut off) from Proxmox's task records"
    )
    rc.add_argument("--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway's configuration")
    rc.add_argument(
        "--min-age",
        type=parse_age,
        help="only calls decided at least this long ago (default: the shutdown grace period; 0s when the "
        "gateway is stopped)",
    )
    rc.add_argument("--since", type=parse_time, help="oldest decision to look at (default: 7d)")
    rc.add_argument("--json", action="store_true", help="print what was settled (or left open) as JSON")
    rc.add_argument(
        "--wait",
        type=parse_age,
        default="60s",
        help="how long to wait while a gateway replica is reconciling (PostgreSQL)",
    )
    rc.set_defaults(func=_reconcile)
