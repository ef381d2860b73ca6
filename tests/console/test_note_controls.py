"""The console's vote form refuses a note with control characters (tab and line breaks excepted) with a
400 and a form error, as the admin API does: a NUL was stored by SQLite (the installation then could not
be moved to PostgreSQL) and was an internal error on PostgreSQL. Real gateway, real OPA."""

from __future__ import annotations

import asyncio
import html

from tests.approvals.conftest import Api
from tests.console.conftest import Browser
from tests.console.test_pages import pending


def test_a_vote_whose_note_holds_control_characters_is_refused(api: Api, carol: Browser) -> None:
    aid, _, _ = pending(api)
    for note in ("ok\x00note", "bell\x07", "esc \x1b[31mred"):
        r = carol.post(f"/admin/approvals/{aid}/vote", {"csrf": carol.csrf, "verdict": "deny", "note": note})
        assert r.status_code == 400, (repr(note), r.status_code, r.text[:300])
        assert "must not contain control characters" in html.unescape(r.text), r.text
    state = asyncio.run(api.admin("GET", f"/admin/approvals/{aid}", api.admin_token)).json()["state"]
    assert state == "pending"  # nothing recorded
    # a textarea's line breaks (CRLF) and tabs are text
    r = carol.post(
        f"/admin/approvals/{aid}/vote", {"csrf": carol.csrf, "verdict": "deny", "note": "line one\r\nline two\tend"}
    )
    assert r.status_code == 200 and "<b>denied</b>" in r.text, r.text[:300]
