"""`audit tail` and `audit search` show client-supplied text (a tool name, a target, an argument name carried
into a denial reason) as one line each: a newline or an ANSI escape in it cannot forge a second listing line or
repaint the operator's terminal. A body of an odd shape (`deny: [1]`, `risk: "high"`) is listed as damaged,
never a traceback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.cli import main as cli
from gateway.store.audit import AuditLog, AuditRecord

FORGED = "list_nodes\n1  2026-01-01T00:00:00.00Z  decision  allow  root\x1b[2K\r"


def _fill(db: Path, records: list[AuditRecord]) -> None:
    async def fill() -> None:
        log = AuditLog(db)
        await log.open()
        try:
            for r in records:
                await log.append(r)
        finally:
            await log.close()

    asyncio.run(fill())


def test_client_text_is_shown_on_one_line_with_controls_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "audit.db"
    _fill(
        db,
        [
            AuditRecord("req-1", "received", "agent", FORGED, "default\n2  fake", None, {}),
            AuditRecord("req-1", "decision", "agent", FORGED, "t", "deny", {"deny": [f"unknown argument {FORGED}"]}),
            AuditRecord("req-1", "refusal", "agent", FORGED, "t", None, {"error": "bad\x1b]0;owned\x07"}),
        ],
    )
    capsys.readouterr()
    for args in (["tail", "-n", "20"], ["search"]):
        assert cli(["audit", *args, "--db", str(db)]) == 0, args
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert len(lines) == 3, lines
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out, out
        assert "list_nodes\\n1" in out and "\\x1b[2K" in out, out


@pytest.mark.parametrize(
    "kind,body",
    [
        ("decision", {"deny": [1]}),
        ("decision", {"risk": "high"}),
        ("decision", {"deny": [], "risk": ["high"]}),
        ("decision", {"deny": 7}),
    ],
)
def test_an_odd_shaped_body_is_listed_as_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, body: dict[str, object]
) -> None:
    db = tmp_path / "audit.db"
    _fill(db, [AuditRecord("req-1", kind, "agent", "list_nodes", "default", "allow", body)])
    capsys.readouterr()
    for args in (["tail", "-n", "20"], ["search"]):
        assert cli(["audit", *args, "--db", str(db)]) == 0, args
        captured = capsys.readouterr()
        lines = captured.out.splitlines()
        assert len(lines) == 1 and "Traceback" not in captured.err, captured
        assert lines[0].startswith("1  ") and "req-1" in lines[0] and "damaged" in lines[0], lines
