"""A call secret is kept in a record's body only when a column states it anyway (equal to the principal,
tool or target), never because it is a part of one: a password that is a piece of the caller's name is
still scrubbed."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.store.audit import AuditLog, AuditRecord


async def test_a_secret_inside_a_column_is_still_scrubbed_one_equal_to_it_is_not(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    log = AuditLog(db)
    await log.open()
    try:
        who = "svc-backup@corp.example"
        for rid, secret in (("inside", "backup@corp"), ("other", "Zx9!kq2Lm"), ("equal", who)):
            await log.append(
                AuditRecord(
                    rid,
                    "result",
                    who,
                    "set_password",
                    "default/qemu/100",
                    "failed",
                    {"error": f"Proxmox: parameter 'password' = '{secret}' is too weak"},
                    scrub=(secret,),
                )
            )
    finally:
        await log.close()
    con = sqlite3.connect(db)
    rows = {r[0]: (r[1], r[2]) for r in con.execute("SELECT request_id, principal, body FROM audit")}
    con.close()
    assert "backup@corp" not in rows["inside"][1] and "[redacted]" in rows["inside"][1]
    assert "Zx9!kq2Lm" not in rows["other"][1]
    assert rows["equal"][1].count(who) == 1  # stated by the principal column anyway: not a secret of this record
    assert {p for p, _ in rows.values()} == {who}  # a call's secret never rewrites a column
