"""`pvegate console sign-out --sub SUB`: end every console session of a person, on every replica.

A console session is a signed cookie that lives until its idle timeout (at most
console.max_session_seconds); disabling someone at the identity provider does not end it.
This records, in the shared database, that every session of SUB begun until now is over:
the next console request of each is refused and sent to sign in again (a new sign-in works,
if the provider still lets them). It is an operator action on the database, like
`pvegate approvals withdraw`: it only ever takes access away, and it is audited.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.core.config import Config, load
from gateway.store.audit import AuditLog, AuditRecord, known_secrets
from gateway.store.backend import refuse_unshared
from gateway.store.db import DatabaseUnavailable, database
from gateway.store.handoffs import MIGRATIONS, SharedStates
from gateway.store.migrations import SchemaError, check
from gateway.store.pgsync import audit_location


async def _sign_out(cfg: Config, sub: str) -> float:
    db = database(cfg)
    audit = AuditLog(audit_location(cfg), secrets=known_secrets(cfg), head_key=cfg.audit_key_path)
    await db.open()
    await audit.open()
    try:
        await check(db, "handoffs", MIGRATIONS)
        before = await SharedStates(db).sign_out_person(sub, cfg.console.max_session_seconds)
        body = {"action": "sign_out_everywhere", "surface": "cli", "by": getpass.getuser(), "before": before}
        await audit.append(AuditRecord(uuid.uuid4().hex, "console", sub, None, None, "ok", body))
        return before
    finally:
        await audit.close()
        await db.close()


def _run(args: argparse.Namespace) -> int:
    sub = str(args.sub).strip()
    if not sub:
        print("error: --sub must name a person (their token's subject)", file=sys.stderr)
        return 2
    cfg = load(args.config)
    refuse_unshared(cfg)
    try:
        before = asyncio.run(_sign_out(cfg, sub))
    except SchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, DatabaseUnavailable) as exc:
        print(f"error: cannot open the database: {exc}", file=sys.stderr)
        return 1
    when = datetime.fromtimestamp(before, UTC).isoformat(timespec="seconds")
    print(f"every console session of {sub} begun until {when} is signed out, on every replica")
    return 0


def register(sub: Any) -> None:
    c = sub.add_parser("console", help="the approvers' console: end a person's sessions")
    csub = c.add_subparsers(dest="console_command", required=True)
    s = csub.add_parser(
        "sign-out",
        help="end every console session of a person now, on every replica (e.g. someone who left)",
    )
    s.add_argument("--sub", required=True, help="the person's subject (the `sub` of their token)")
    s.add_argument("--config", "-c", type=Path, default=Path("pvegate.yaml"), help="the gateway's pvegate.yaml")
    s.set_defaults(func=_run)
