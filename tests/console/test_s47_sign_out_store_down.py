"""Signing out while the shared database cannot be asked. Every console request asks it whether the
session was signed out, and takes "cannot say" for "signed out" (fail closed). The sign-out itself asked
it too, so the person's "Sign out" was taken for a request without a session: a redirect to the sign-in,
the cookie left in the browser (alive again once the database answers), nothing in the audit and nothing
said. docs/console.md promises the opposite: the cookie is cleared, the sign-out is audited
`not_recorded`, and the page says a copy of the cookie stays valid until the idle timeout.

Real gateway, OPA and simulator; the database fault is the shared SQLite database's own (its sign-out
table gone), put back afterwards."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gateway.admin.console.session import SESSION_COOKIE
from gateway.dev.devenv import DevEnv
from tests.console.conftest import CAROL, Browsers
from tests.support import GatewayThread, audit_rows, sqlite_exec


def _shared_database(env: DevEnv) -> Path:
    """The SQLite file that holds the console's sign-outs."""
    state = env.config.state_dir
    for path in [env.config.audit_path, *sorted(Path(state).glob("*.db"))]:
        con = sqlite3.connect(path)
        try:
            found = con.execute("SELECT 1 FROM sqlite_master WHERE name = 'console_signouts'").fetchone()
        finally:
            con.close()
        if found:
            return Path(path)
    raise AssertionError("no database holds console_signouts")


def test_s47_a_sign_out_the_database_cannot_take_clears_the_cookie_and_says_so(
    cgw: GatewayThread, cenv: DevEnv, browsers: Browsers
) -> None:
    b = browsers(cenv, CAROL)
    assert b.session is not None
    sid = b.session.sid
    assert b.get("/admin/approvals").status_code == 200
    db = _shared_database(cenv)
    sqlite_exec(db, "ALTER TABLE console_signouts RENAME TO console_signouts_away")
    try:
        assert b.get("/admin/approvals").status_code == 303  # fail closed: nobody is signed in meanwhile
        r = b.post("/admin/logout", {"csrf": b.csrf})
        assert r.status_code == 200, (r.status_code, r.headers.get("location"))
        assert "could not record it" in r.text
        assert f'{SESSION_COOKIE}=""' in r.headers["set-cookie"] and "Max-Age=0" in r.headers["set-cookie"]
        # a wrong token is still refused: the cookie alone signs nothing out
        assert browsers(cenv, CAROL).post("/admin/logout", {"csrf": "wrong"}).status_code == 403
    finally:
        sqlite_exec(db, "ALTER TABLE console_signouts_away RENAME TO console_signouts")
    rows = [
        json.loads(row["body"])
        for row in audit_rows(cenv.config.audit_path)
        if row["kind"] == "console" and row["principal"] == "carol" and row["outcome"] == "not_recorded"
    ]
    assert any(body["action"] == "sign_out" and body.get("session") == sid for body in rows), rows
