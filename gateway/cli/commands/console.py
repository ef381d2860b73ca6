"""`pvegate console sign-out --sub SUB`: end every console session of a person, on every replica.

A console session is a signed cookie that lives until its idle timeout (at most
console.max_session_seconds); disabling someone at the identity provider does not end it.
This records, in the shared database, that every session of SUB begun until now is over:
the next console request of each is refused and sent to sign in again (a new sign-in works,
if the provider still lets them). It is an operator action on the database, like
`pvegate approvals withdraw`: it only ever takes access away, and it is audited.

A subject nobody signed in as within console.max_session_seconds (per the audit) has no
session to end: that is refused as a likely typo, with the nearest subjects that did sign in,
unless --force says the operator means it.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import getpass
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.cli.commands.audit import text_arg
from gateway.core.config import Config, load
from gateway.store.audit import AuditLog, AuditRecord, known_secrets
from gateway.store.audit_seal import AuditKeyError
from gateway.store.backend import refuse_unshared
from gateway.store.db import Database, database
from gateway.store.handoffs import MIGRATIONS, SharedStates
from gateway.store.migrations import SchemaError, check
from gateway.store.outcomes import STORE_ERRORS
from gateway.store.pgsync import audit_location

CLOCK_MARGIN_SECONDS = 300.0  # replicas' clocks stamp the audit; this host's clock draws the window


class NoSession(Exception):
    """Nobody signed in as that subject within the window: nothing to sign out; likely a typo."""

    def __init__(self, nearest: list[str]) -> None:
        super().__init__("no console sign-in on record")
        self.nearest = nearest


class Unaudited(Exception):
    """The sign-out took effect; its audit record could not be written."""

    def __init__(self, before: float, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.before = before


def operator_name() -> str:
    """Who ran the command, for the audit: the login name, else the numeric user id (a container run
    under an arbitrary uid has no passwd entry, and getpass then raises)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


async def _sign_out(cfg: Config, sub: str, force: bool) -> float:
    by = operator_name()  # before anything is changed: nothing after the sign-out may fail but its record
    db = database(cfg)
    audit = AuditLog(audit_location(cfg), secrets=known_secrets(cfg), head_key=cfg.audit_key_path)
    # each store is closed whatever fails once it is open (the audit's opening too): aiosqlite's thread,
    # left open, keeps the process from exiting after its error was said
    await db.open()
    try:
        await audit.open()
        try:
            return await _signed_out(cfg, db, audit, sub, force, by)
        finally:
            await audit.close()
    finally:
        await db.close()


async def _signed_out(cfg: Config, db: Database, audit: AuditLog, sub: str, force: bool, by: str) -> float:
    await check(db, "handoffs", MIGRATIONS)
    if not force:
        since = time.time() - cfg.console.max_session_seconds - CLOCK_MARGIN_SECONDS
        try:
            known = bool(await audit.console_sign_ins(since, sub))
        except (*STORE_ERRORS, OSError):
            known = True  # cannot tell: take the access away anyway (its record will say if it failed)
        if not known:
            everyone = await audit.console_sign_ins(since)
            raise NoSession(difflib.get_close_matches(sub, sorted(everyone), n=3, cutoff=0.6))
    before = await SharedStates(db).sign_out_person(sub, cfg.console.max_session_seconds)
    body = {"action": "sign_out_everywhere", "surface": "cli", "by": by, "before": before}
    try:
        await audit.append(AuditRecord(uuid.uuid4().hex, "console", sub, None, None, "ok", body))
    except (*STORE_ERRORS, OSError) as exc:
        raise Unaudited(before, exc) from exc
    return before


def _run(args: argparse.Namespace) -> int:
    sub = str(args.sub).strip()
    if not sub:
        print("error: --sub must name a person (their token's subject)", file=sys.stderr)
        return 2
    cfg = load(args.config)
    refuse_unshared(cfg)
    try:
        before = asyncio.run(_sign_out(cfg, sub, args.force))
    except (SchemaError, AuditKeyError) as exc:
        print(f"error: nothing was signed out: {exc}", file=sys.stderr)
        return 1
    except NoSession as exc:
        hours = cfg.console.max_session_seconds / 3600
        hint = f"; did you mean {' or '.join(exc.nearest)}?" if exc.nearest else ""
        print(
            f"error: nothing was signed out: nobody signed in to the console as {sub!r} in the last "
            f"{hours:g} h (console.max_session_seconds, per the audit), so no session of theirs can be "
            f"open{hint} (--force records the sign-out anyway)",
            file=sys.stderr,
        )
        return 1
    except Unaudited as exc:
        print(
            f"error: every console session of {sub} begun until {_when(exc.before)} is signed out, on every "
            f"replica, but its audit record could not be written ({exc}); note it in your own records",
            file=sys.stderr,
        )
        return 1
    except (*STORE_ERRORS, OSError) as exc:
        print(f"error: nothing was signed out: the database cannot take it ({exc})", file=sys.stderr)
        return 1
    print(f"every console session of {sub} begun until {_when(before)} is signed out, on every replica")
    return 0


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def register(sub: Any) -> None:
    c = sub.add_parser("console", help="the approvers' console: end a person's sessions")
    csub = c.add_subparsers(dest="console_command", required=True)
    s = csub.add_parser(
        "sign-out",
        help="end every console session of a person now, on every replica (e.g. someone who left)",
    )
    # an argument that is not UTF-8 (lone surrogates) no database takes: a usage error, not a traceback
    s.add_argument("--sub", required=True, type=text_arg, help="the person's subject (the `sub` of their token)")
    s.add_argument(
        "--force",
        action="store_true",
        help="sign out even a subject with no console sign-in on record in the session window",
    )
    s.add_argument("--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway's pvegate.yaml")
    s.set_defaults(func=_run)
